"""What is running on this machine's GPUs now, as ``nvidia-smi`` reports it.

Pure parsers for three queries (their exact arguments are the ``*_ARGS`` constants), each tested
on saved outputs, and readers that run them through ``gateway.launch.gpu.run_nvidia_smi`` (None
without a working nvidia-smi):

- :func:`parse_memory`: per GPU index, uuid, memory used/total and MIG mode;
- :func:`parse_compute_apps`: the processes holding GPU memory (pid, name, MiB, GPU uuid);
- :func:`parse_versions`: driver version and the highest CUDA version the driver supports, from
  the banner of plain ``nvidia-smi``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gateway.launch.gpu import GpuParseError, Runner, run_nvidia_smi

MEMORY_ARGS = ("--query-gpu=index,uuid,memory.used,memory.total,mig.mode.current", "--format=csv,noheader,nounits")
APPS_ARGS = ("--query-compute-apps=pid,process_name,used_memory,gpu_uuid", "--format=csv,noheader,nounits")
TIMEOUT_S = 10.0
_BANNER = re.compile(r"Driver Version:\s*([\d.]+)\s+CUDA Version:\s*([\d.]+)")


@dataclass(frozen=True)
class GpuUse:
    index: int
    uuid: str
    used_mib: int | None
    total_mib: int | None
    mig: str  # "Enabled", "Disabled", or "[N/A]" (GPUs without MIG)

    @property
    def mig_enabled(self) -> bool:
        return self.mig.strip().lower() == "enabled"


@dataclass(frozen=True)
class ComputeApp:
    pid: int
    name: str
    used_mib: int | None
    gpu_uuid: str


@dataclass(frozen=True)
class DriverVersions:
    driver: str  # e.g. "550.54.15"
    cuda: str  # the highest CUDA runtime the driver supports, e.g. "12.4"


def _mib(text: str) -> int | None:
    text = text.removesuffix("MiB").strip()
    return int(text) if text.isdigit() else None


def _rows(text: str, fields: int, what: str) -> list[list[str]]:
    rows = []
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("No running"):
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < fields:
            raise GpuParseError(f"line {n}: expected {fields} comma-separated fields ({what}), got {line!r}")
        rows.append(parts)
    return rows


def parse_memory(text: str) -> list[GpuUse]:
    """``index, uuid, memory.used, memory.total, mig.mode.current`` lines."""
    out = []
    for parts in _rows(text, 5, "index, uuid, memory.used, memory.total, mig.mode.current"):
        if not parts[0].isdigit():
            raise GpuParseError(f"GPU index {parts[0]!r} is not a number")
        out.append(GpuUse(int(parts[0]), parts[1], _mib(parts[2]), _mib(parts[3]), parts[4]))
    return out


def parse_compute_apps(text: str) -> list[ComputeApp]:
    """``pid, process_name, used_memory, gpu_uuid`` lines (the process name may contain commas)."""
    out = []
    for parts in _rows(text, 4, "pid, process_name, used_memory, gpu_uuid"):
        if not parts[0].isdigit():
            raise GpuParseError(f"pid {parts[0]!r} is not a number")
        out.append(ComputeApp(int(parts[0]), ",".join(parts[1:-2]), _mib(parts[-2]), parts[-1]))
    return out


def parse_versions(text: str) -> DriverVersions | None:
    """Driver and CUDA version from the banner of ``nvidia-smi`` (None if there is no banner)."""
    m = _BANNER.search(text)
    return DriverVersions(m.group(1), m.group(2)) if m else None


def read_memory(run: Runner = run_nvidia_smi) -> list[GpuUse] | None:
    text = run(MEMORY_ARGS, TIMEOUT_S)
    try:
        return None if text is None else parse_memory(text)
    except GpuParseError:
        return None


def read_compute_apps(run: Runner = run_nvidia_smi) -> list[ComputeApp] | None:
    text = run(APPS_ARGS, TIMEOUT_S)
    try:
        return None if text is None else parse_compute_apps(text)
    except GpuParseError:
        return None


def read_versions(run: Runner = run_nvidia_smi) -> DriverVersions | None:
    text = run((), TIMEOUT_S)
    return None if text is None else parse_versions(text)
