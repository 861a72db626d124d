"""What GPUs this machine has and how they are linked, as ``nvidia-smi`` reports it.

Two pure parsers (:func:`parse_inventory`, :func:`parse_topology`) turn the text of
``nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader,nounits`` and of
``nvidia-smi topo -m`` into typed values; two readers (:func:`read_inventory`,
:func:`read_topology`) run those commands with a timeout and return ``None`` when
``nvidia-smi`` is absent or fails, so a machine without NVIDIA GPUs is not an error.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

INVENTORY_ARGS = ("--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits")
TOPOLOGY_ARGS = ("topo", "-m")
TIMEOUT_S = 10.0

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_ROW = re.compile(r"^(GPU\d+)\s+(.*)$")


class GpuParseError(ValueError):
    """Text that is not what the nvidia-smi command prints; the message names the line."""


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    memory_mib: int | None  # None when nvidia-smi prints [N/A] (e.g. some MIG setups)

    @property
    def memory_gib(self) -> float | None:
        return None if self.memory_mib is None else self.memory_mib / 1024


@dataclass(frozen=True)
class Topology:
    """The GPU-to-GPU part of ``nvidia-smi topo -m``: ``links[(a, b)]`` is e.g. NV12, PIX, SYS."""

    gpus: tuple[int, ...]
    links: dict[tuple[int, int], str]

    def link(self, a: int, b: int) -> str | None:
        return self.links.get((a, b))


def parse_inventory(text: str) -> list[GpuInfo]:
    """Parse ``index, name, memory.total`` lines (MiB, no header, no units)."""
    gpus: list[GpuInfo] = []
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3:
            raise GpuParseError(f"line {n}: expected 'index, name, memory.total', got {line!r}")
        index, name, mem = parts[0], ",".join(parts[1:-1]).strip(), parts[-1]
        if not index.isdigit():
            raise GpuParseError(f"line {n}: GPU index {index!r} is not a number ({line!r})")
        mem = mem.removesuffix("MiB").strip()
        if mem.isdigit():
            memory: int | None = int(mem)
        elif mem.startswith("[") or mem.upper() == "N/A":
            memory = None
        else:
            raise GpuParseError(
                f"line {n}: memory.total {parts[-1]!r} is not a number of MiB "
                "(use --format=csv,noheader,nounits)"
            )
        gpus.append(GpuInfo(index=int(index), name=name, memory_mib=memory))
    return gpus


def parse_topology(text: str) -> Topology:
    """Parse the matrix of ``nvidia-smi topo -m``; NIC columns and affinities are ignored."""
    lines = [_ANSI.sub("", raw).rstrip() for raw in text.splitlines()]
    header: list[str] | None = None
    links: dict[tuple[int, int], str] = {}
    gpus: list[int] = []
    for line in lines:
        if header is None:
            if line[:1].isspace() and "GPU0" in line:
                header = []
                for token in line.split():
                    if token == "CPU" or token.endswith("Affinity"):
                        break
                    header.append(token)
            continue
        m = _ROW.match(line)
        if m is None:
            if line.startswith("Legend"):
                break
            continue
        row = int(m.group(1)[3:])
        cells = m.group(2).split()
        if len(cells) < len(header):
            raise GpuParseError(f"row {m.group(1)} has {len(cells)} cells for {len(header)} columns")
        gpus.append(row)
        for col, cell in zip(header, cells, strict=False):
            if col.startswith("GPU") and col[3:].isdigit() and int(col[3:]) != row:
                links[(row, int(col[3:]))] = cell
    if header is None:
        raise GpuParseError("no header row with GPU0 found (is this `nvidia-smi topo -m` output?)")
    return Topology(gpus=tuple(gpus), links=links)


Runner = Callable[[Sequence[str], float], str | None]


def run_nvidia_smi(args: Sequence[str], timeout: float = TIMEOUT_S) -> str | None:
    """stdout of ``nvidia-smi ARGS``, or None when it is not installed, fails or times out."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run(
            [exe, *args], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def read_inventory(run: Runner = run_nvidia_smi) -> list[GpuInfo] | None:
    """This machine's GPUs, or None without a working nvidia-smi."""
    text = run(INVENTORY_ARGS, TIMEOUT_S)
    if text is None:
        return None
    try:
        return parse_inventory(text)
    except GpuParseError:
        return None


def read_topology(run: Runner = run_nvidia_smi) -> Topology | None:
    """This machine's GPU topology, or None without a working nvidia-smi (or with one GPU)."""
    text = run(TOPOLOGY_ARGS, TIMEOUT_S)
    if text is None:
        return None
    try:
        return parse_topology(text)
    except GpuParseError:
        return None
