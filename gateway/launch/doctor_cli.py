"""`gateway doctor`: run the preflight checks of ``gateway.launch.doctor`` and print them.

This module only gathers the inputs (the config file, ``nvidia-smi`` output or files holding it)
and prints the findings, grouped by upstream, as text or JSON. The exit status is 1 when any
finding is an error, 2 when the inputs cannot be read, 0 otherwise (warnings included).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any, TextIO

from gateway.config import ConfigError, GatewayConfig, UpstreamSpec, load_config
from gateway.launch import containers, gpu, gpu_state, ports, preflight
from gateway.launch.doctor import ACROSS, Finding, diagnose
from gateway.launch.model_shape import read_model_config
from gateway.launch.process import DEFAULT_STATE_DIR, StateFile

DEFAULT_CONFIG = "config/gateway.yaml"
_LABEL = {"error": "ERROR", "warning": "warn", "info": "info"}


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "doctor",
        help="preflight checks of the launch sections",
        description="Check every upstream's `launch:` section against its model's config.json, this "
        "machine's GPUs (nvidia-smi) and the other backends before starting vLLM. Exit status: 0 "
        "without errors (warnings allowed), 1 with errors, 2 when the inputs cannot be read.",
    )
    p.add_argument("--config", help=f"config file (env GATEWAY_CONFIG; default {DEFAULT_CONFIG})")
    p.add_argument("--gpu-memory-gib", type=float, metavar="N",
                   help="memory per GPU when neither launch.gpu_memory_gib nor nvidia-smi gives it")
    p.add_argument("--gpus-file", metavar="F", help="saved output of `nvidia-smi --query-gpu=index,name,"
                   "memory.total --format=csv,noheader,nounits` (default: run it here)")
    p.add_argument("--topo-file", metavar="F", help="saved output of `nvidia-smi topo -m` (default: run it here)")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.add_argument("--deploy", metavar="DIR", default=None,
                   help="compose/Kubernetes files to check for multi-GPU vLLM (/dev/shm, nofile); default: "
                   "./deploy when it exists; '' skips")
    p.add_argument("--no-live", action="store_true",
                   help="skip the checks of this machine's state: ports, processes on the GPUs, MIG, the "
                   "versions of launch.python (skipped anyway with --gpus-file/--topo-file)")
    p.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR),
                   help=f"where `gateway backends up` records its backends (default {DEFAULT_STATE_DIR})")
    p.set_defaults(func=run)


def _read(path: str, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None


def _inputs(args: argparse.Namespace) -> tuple[list[gpu.GpuInfo] | None, gpu.Topology | None, str, str]:
    """GPU inventory and topology, and where they came from.

    With --gpus-file or --topo-file the files describe the target machine and nvidia-smi is not
    run at all (so a saved inventory of another host is never mixed with this one's topology).
    """
    gpus: list[gpu.GpuInfo] | None = None
    topology: gpu.Topology | None = None
    try:
        if args.gpus_file or args.topo_file:
            if args.gpus_file:
                gpus = gpu.parse_inventory(_read(args.gpus_file, "GPU list"))
            if args.topo_file:
                topology = gpu.parse_topology(_read(args.topo_file, "topology"))
            return gpus, topology, args.gpus_file or "none (no --gpus-file)", args.topo_file or "none"
    except gpu.GpuParseError as exc:
        raise ValueError(f"{args.gpus_file if gpus is None else args.topo_file}: {exc}") from None
    gpus = gpu.read_inventory()
    if gpus is None:
        return None, None, "none (no working nvidia-smi)", "none"
    topology = gpu.read_topology() if len(gpus) > 1 else None
    return gpus, topology, "nvidia-smi", "nvidia-smi topo -m" if topology is not None else "none"


def run(args: argparse.Namespace) -> int:
    path = args.config or os.environ.get("GATEWAY_CONFIG") or DEFAULT_CONFIG
    try:
        config = load_config(path, os.environ)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        gpus, topology, gpus_from, topo_from = _inputs(args)
    except ValueError as exc:
        print(f"gateway doctor: {exc}", file=sys.stderr)
        return 2
    findings = diagnose(config, read_model_config, gpus=gpus, topology=topology,
                        gpu_memory_gib=args.gpu_memory_gib)
    findings += preflight.env_visible_devices([u for _, u in config.upstreams() if u.launch is not None])
    if not (args.no_live or args.gpus_file or args.topo_file):
        findings += live_findings(config, args.state_dir)
    deploy = args.deploy if args.deploy is not None else ("deploy" if Path("deploy").is_dir() else "")
    if deploy:
        findings += containers.check_dir(Path(deploy))
    if args.json:
        print(json.dumps({
            "config": path,
            "gpus": None if gpus is None else [
                {"index": g.index, "name": g.name, "memory_mib": g.memory_mib} for g in gpus],
            "topology": topo_from if topology is not None else None,
            "findings": [f.as_dict() for f in findings],
            "errors": sum(f.severity == "error" for f in findings),
            "warnings": sum(f.severity == "warning" for f in findings),
        }, indent=2))
    else:
        print_report(config, path, findings, gpus, gpus_from, topo_from, sys.stdout)
    return 1 if any(f.severity == "error" for f in findings) else 0


def live_findings(config: GatewayConfig, state_dir: str) -> list[Finding]:
    """Ports, processes on the GPUs, MIG and launch.python's versions, on this machine now."""
    launched = [u for _, u in config.upstreams() if u.launch is not None]
    records = StateFile(state_dir).load()
    own = {name: set(r.live_members()) for name, r in records.items()}
    findings: list[Finding] = []
    holders: dict[str, list[ports.Listener]] = {}
    for up in launched:
        found = ports.listeners(up.port)
        if found:
            holders[up.name or up.model] = found
    findings += preflight.port_holders(launched, holders, own)
    if any(u.launch is not None and u.launch.device != "cpu" for u in launched):
        use = gpu_state.read_memory()
        apps = gpu_state.read_compute_apps()
        if use is not None:
            findings += preflight.mig_mode(launched, use)
            if apps is not None:
                findings += preflight.gpu_processes(launched, use, apps, own)
    driver: gpu_state.DriverVersions | None = None
    probes: dict[str, dict[str, object] | str] = {}
    for up in _python_given(launched):
        assert up.launch is not None
        if up.launch.device != "cpu" and driver is None:
            driver = gpu_state.read_versions()
        if up.launch.python not in probes:
            probes[up.launch.python] = preflight.probe_python(up.launch.python)
        findings += preflight.versions(up, probes[up.launch.python], driver)
    return findings


def _python_given(launched: list[UpstreamSpec]) -> list[UpstreamSpec]:
    """Backends whose launch section names its interpreter (the default `python` is not probed)."""
    return [u for u in launched if u.launch is not None and "python" in u.launch.model_fields_set]


def print_report(config: GatewayConfig, path: str, findings: list[Finding], gpus: list[gpu.GpuInfo] | None,
                 gpus_from: str, topo_from: str, out: TextIO) -> None:
    """The human form: a header, the findings grouped by upstream, a one-line summary."""
    print(f"gateway doctor: {path}", file=out)
    listing = ", ".join(f"{g.index}: {g.name} {g.memory_mib} MiB" for g in gpus or [])
    print(f"  GPUs: {gpus_from}" + (f" ({listing})" if listing else ""), file=out)
    print(f"  topology: {topo_from}", file=out)
    groups: dict[str, list[Finding]] = {}
    for f in findings:
        groups.setdefault(f.upstream, []).append(f)
    for name, items in groups.items():
        title = name
        names = {u.name for _, u in config.upstreams()}
        if name != ACROSS and name in names:  # else a file (container checks) or ACROSS
            model, up = config.upstream(name)
            launch = up.launch
            parallel = f", TP {launch.tensor_parallel_size}" if launch else ""
            parallel += f" PP {launch.pipeline_parallel_size}" if launch and launch.pipeline_parallel_size > 1 else ""
            title = f"{name} (model {model.id}, {up.url}{parallel})"
        print(f"\n{title}", file=out)
        for f in items:
            head = f"  {_LABEL[f.severity]:<5} {f.check}: "
            print(textwrap.fill(f.message, width=100, initial_indent=head, subsequent_indent=" " * 8,
                                break_on_hyphens=False, break_long_words=False), file=out)
    counts = {s: sum(f.severity == s for f in findings) for s in ("error", "warning", "info")}
    verdict = "FAIL: fix the errors before starting the backends" if counts["error"] else "OK"
    print(f"\n{counts['error']} errors, {counts['warning']} warnings, {counts['info']} info: {verdict}", file=out)
