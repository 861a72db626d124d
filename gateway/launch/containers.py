"""`gateway doctor`: container launches of vLLM (compose and Kubernetes files, e.g. ``deploy/``).

Multi-GPU (tensor/pipeline parallel) vLLM moves tensors between its workers through ``/dev/shm``;
Docker gives a container 64 MB of it and Kubernetes the same unless a memory-backed ``emptyDir``
is mounted there, which makes the start crash (bus errors, NCCL "unhandled system error") or
hang. Compose services need ``shm_size`` (or ``ipc: host``), pods an ``emptyDir`` with
``medium: Memory`` at ``/dev/shm``. Open files: ``ulimits.nofile`` 65536 in compose (seed 000).

:func:`check_compose` and :func:`check_k8s` take parsed YAML; :func:`check_dir` reads a
directory's ``*compose*.y*ml`` and ``k8s/*.y*ml`` (or ``*.y*ml`` with Kubernetes kinds).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from gateway.launch.doctor import Finding

NOFILE = 65536
MIN_SHM_BYTES = 1 << 30
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Pod", "Job")


def size_bytes(value: Any) -> int | None:
    """``8gb``, ``10.24g``, ``512m``, ``8Gi`` or a number of bytes; None when unreadable."""
    if isinstance(value, int):
        return value
    m = _SIZE.match(str(value))
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()]) if m else None


def world_size(args: Sequence[str]) -> int:
    """tensor x pipeline parallel size from vLLM arguments (``--flag=N``, ``--flag N``, ``-tp N``)."""
    sizes = {"tp": 1, "pp": 1}
    names = {"--tensor-parallel-size": "tp", "-tp": "tp", "--pipeline-parallel-size": "pp", "-pp": "pp"}
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag in names:
            raw = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            if raw.isdigit():
                sizes[names[flag]] = int(raw)
    return sizes["tp"] * sizes["pp"]


def _strings(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return value.split()
    return [str(v) for v in value] if isinstance(value, list) else []


def _is_vllm(image: Any, words: Sequence[str]) -> bool:
    """A vLLM server: the vLLM image, ``python -m vllm.entrypoints...`` or ``vllm serve``."""
    img = str(image or "").lower()
    return "vllm/vllm" in img or "vllm-openai" in img or any(w.startswith("vllm.entrypoints") for w in words) \
        or any(a.endswith("vllm") and b == "serve" for a, b in itertools.pairwise(words))


def check_compose(label: str, data: Mapping[str, Any]) -> list[Finding]:
    findings = []
    for name, svc in (data.get("services") or {}).items():
        if not isinstance(svc, Mapping):
            continue
        args = _strings(svc.get("entrypoint")) + _strings(svc.get("command"))
        if not _is_vllm(svc.get("image"), args):
            continue
        where = f"{label}: {name}"
        world = world_size(args)
        shm = size_bytes(svc.get("shm_size")) if svc.get("shm_size") is not None else None
        if world > 1:
            if svc.get("ipc") == "host":
                findings.append(Finding("info", where, "container-shm", f"{world} ranks; ipc: host shares the host's "
                                        "/dev/shm"))
            elif shm is None or shm < MIN_SHM_BYTES:
                have = "Docker's default 64 MB" if shm is None else f"shm_size {svc.get('shm_size')}"
                findings.append(Finding("error", where, "container-shm", f"{world} ranks (tensor x pipeline "
                                        f"parallel) with {have} of /dev/shm: the workers' shared memory runs out "
                                        "(bus error, NCCL 'unhandled system error') or the start hangs. Set "
                                        "shm_size: 8gb (or ipc: host)"))
            else:
                findings.append(Finding("info", where, "container-shm", f"{world} ranks; shm_size "
                                        f"{svc.get('shm_size')}"))
        nofile = ((svc.get("ulimits") or {}).get("nofile")) if isinstance(svc.get("ulimits"), Mapping) else None
        soft = nofile.get("soft") if isinstance(nofile, Mapping) else nofile
        if not isinstance(soft, int) or soft < NOFILE:
            have = "not set (the engine's default)" if soft is None else str(soft)
            findings.append(Finding("warning", where, "container-nofile", f"ulimits nofile is {have}: with many "
                                    "client connections vLLM fails with 'Too many open files'. Set ulimits: "
                                    f"nofile: {{soft: {NOFILE}, hard: {NOFILE}}}"))
    return findings


def _pod_specs(doc: Mapping[str, Any]) -> Mapping[str, Any] | None:
    if doc.get("kind") == "Pod":
        spec = doc.get("spec")
    else:
        spec = ((doc.get("spec") or {}).get("template") or {}).get("spec")
        if doc.get("kind") == "Job" and spec is None:
            spec = doc.get("spec")
    return spec if isinstance(spec, Mapping) else None


def check_k8s(label: str, docs: Sequence[Any]) -> list[Finding]:
    findings = []
    for doc in docs:
        if not isinstance(doc, Mapping) or doc.get("kind") not in _WORKLOADS:
            continue
        spec = _pod_specs(doc)
        if spec is None:
            continue
        volumes = {v.get("name"): v for v in spec.get("volumes") or [] if isinstance(v, Mapping)}
        for c in spec.get("containers") or []:
            if not isinstance(c, Mapping):
                continue
            args = _strings(c.get("command")) + _strings(c.get("args"))
            if not _is_vllm(c.get("image"), args):
                continue
            where = f"{label}: {doc.get('kind')}/{(doc.get('metadata') or {}).get('name')} container {c.get('name')}"
            world = world_size(args)
            if world < 2:
                continue
            mounts = [m for m in c.get("volumeMounts") or [] if isinstance(m, Mapping)
                      and m.get("mountPath") == "/dev/shm"]
            vol = volumes.get(mounts[0].get("name")) if mounts else None
            empty = vol.get("emptyDir") if isinstance(vol, Mapping) else None
            if isinstance(empty, Mapping) and empty.get("medium") == "Memory":
                findings.append(Finding("info", where, "container-shm", f"{world} ranks; /dev/shm is a memory-backed "
                                        f"emptyDir (sizeLimit {empty.get('sizeLimit', 'none')})"))
            else:
                findings.append(Finding("error", where, "container-shm", f"{world} ranks (tensor x pipeline parallel) "
                                        "without a memory-backed /dev/shm: the container's 64 MB runs out (bus error, "
                                        "NCCL 'unhandled system error') or the start hangs. Mount an emptyDir with "
                                        "medium: Memory (sizeLimit e.g. 8Gi) at /dev/shm"))
    return findings


def check_dir(path: Path) -> list[Finding]:
    """Every compose and Kubernetes file under ``path`` (not recursive beyond ``k8s/``)."""
    findings: list[Finding] = []
    files = sorted({*path.glob("*.yml"), *path.glob("*.yaml"), *path.glob("k8s/*.yml"), *path.glob("k8s/*.yaml")})
    for f in files:
        try:
            docs = [d for d in yaml.safe_load_all(f.read_text(encoding="utf-8")) if d is not None]
        except (OSError, yaml.YAMLError):
            continue
        label = str(f)
        for d in docs:
            if isinstance(d, Mapping) and "services" in d:
                findings += check_compose(label, d)
        findings += check_k8s(label, docs)
    return findings
