"""Gather the inputs of ``verify --deep`` (log, nvidia-smi, the backend's API) and print the checks."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import httpx

from gateway.config import UpstreamSpec
from gateway.launch import deep_verify as dv
from gateway.launch import preflight
from gateway.launch.commands import LaunchError, build_command
from gateway.launch.diagnose import Diagnosis, analyse
from gateway.launch.gpu_state import read_memory
from gateway.launch.process import StateFile

_LABEL = {"ok": "ok", "warn": "warn", "fail": "FAIL", "skip": "skip"}


def _log_path(up: UpstreamSpec, args: argparse.Namespace) -> Path | None:
    rec = StateFile(args.state_dir).load().get(up.name or "")
    if rec is not None:
        return Path(rec.log)
    if up.launch is None:
        return None
    try:
        log_file = build_command(up, log_dir=str(args.log_dir)).log_file
    except LaunchError:
        return None
    return Path(log_file) if log_file else None


def deep_checks(up: UpstreamSpec, args: argparse.Namespace) -> list[dv.Check]:
    log = _log_path(up, args)
    diag: Diagnosis | None = None
    if log is not None:
        try:
            diag = analyse(log.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            diag = None
    launch = up.launch
    world = launch.tensor_parallel_size * launch.pipeline_parallel_size if launch else None
    checks = [dv.check_ranks(diag, world, str(log) if log else "no launch section")]
    if launch is None:
        checks.append(dv.Check("skip", "gpu-memory", "no launch section: the backend's GPUs are unknown"))
    else:
        cpu = launch.device == "cpu"
        checks.append(dv.check_balance(None if cpu else read_memory(), preflight.backend_devices(launch), cpu))
    base = up.url
    if launch is not None:
        try:
            base = build_command(up, log_dir=str(args.log_dir)).local_url
        except LaunchError:
            pass
    timeout = httpx.Timeout(max(args.timeout * 12, 30.0), connect=args.timeout)
    with httpx.Client(trust_env=False, timeout=timeout) as client:
        api = dv.Backend(client, base, up.model, up.api_key_value())
        first = dv.check_one_request(api)
        checks.append(first)
        if first.status == "fail":
            checks.append(dv.Check("skip", "lengths", "the first request failed"))
            checks.append(dv.Check("skip", "determinism", "the first request failed"))
            return checks
        checks += dv.check_lengths(api, launch.max_model_len if launch else None)
        checks.append(dv.check_determinism(api))
    return checks


def run_deep(up: UpstreamSpec, args: argparse.Namespace) -> int:
    print(f"gateway backends verify --deep {up.name}: {up.url} serving {up.model!r}", flush=True)
    checks = deep_checks(up, args)
    for c in checks:
        print(f"  {_LABEL[c.status]:<5} {c.name}: {c.detail}", flush=True)
    failed = sum(c.status == "fail" for c in checks)
    warned = sum(c.status == "warn" for c in checks)
    print(f"{failed} failed, {warned} warnings, {sum(c.status == 'ok' for c in checks)} ok, "
          f"{sum(c.status == 'skip' for c in checks)} skipped", flush=True)
    if failed:
        print(f"to see which layer failed: gateway backends diagnose {up.name}", file=sys.stderr)
    return 1 if failed else 0
