"""``gateway backends diagnose NAME [--log FILE]``: which layer failed, the evidence, the change.

Reads the backend's log (the launcher's log file: the state file's record when `up` started it,
else ``launch.log_file`` or ``<log-dir>/<NAME>.log``; or any vLLM log given with ``--log``),
analyses its last start with :mod:`gateway.launch.diagnose` and prints the result.
Exit status: 0 healthy, 1 a diagnosis (or an unrecognised error), 2 no log (or a usage error).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from pathlib import Path
from typing import TextIO

from gateway.config import ConfigError, load_config
from gateway.launch.commands import LaunchError, build_command
from gateway.launch.diagnose import Diagnosis, Evidence, analyse
from gateway.launch.process import StateFile
from gateway.launch.signatures import LAYERS

DEFAULT_CONFIG = "config/gateway.yaml"
WIDTH = 100


def find_log(args: argparse.Namespace) -> Path:
    """The log to read for ``args.name``; raises ValueError with the reason when there is none."""
    if args.log:
        return Path(args.log)
    rec = StateFile(args.state_dir).load().get(args.name)
    if rec is not None:
        return Path(rec.log)
    path = args.config or os.environ.get("GATEWAY_CONFIG") or DEFAULT_CONFIG
    try:
        config = load_config(path, os.environ)
        _, up = config.upstream(args.name)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    except KeyError as exc:
        raise ValueError(str(exc.args[0])) from None
    try:
        cmd = build_command(up, log_dir=str(args.log_dir))
    except LaunchError as exc:
        raise ValueError(f"{exc} (pass the vLLM log with --log FILE)") from None
    assert cmd.log_file is not None
    return Path(cmd.log_file)


def launch_context(args: argparse.Namespace) -> str | None:
    """The backend's launch settings that the layers depend on, when the config names it."""
    path = args.config or os.environ.get("GATEWAY_CONFIG") or DEFAULT_CONFIG
    try:
        _, up = load_config(path, os.environ).upstream(args.name)
    except (ConfigError, KeyError):
        return None
    launch = up.launch
    if launch is None:
        return None
    parts = [f"device {launch.device}", f"tensor_parallel_size {launch.tensor_parallel_size}"]
    if launch.pipeline_parallel_size > 1:
        parts.append(f"pipeline_parallel_size {launch.pipeline_parallel_size}")
    visible = launch.cuda_visible_devices or launch.env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        parts.append(f"CUDA_VISIBLE_DEVICES {visible!r}")
    for field in ("max_model_len", "gpu_memory_utilization", "dtype", "quantization"):
        value = getattr(launch, field)
        if value not in (None, "auto"):
            parts.append(f"{field} {value}")
    return f"{path}: " + ", ".join(parts)


def _wrap(label: str, text: str) -> str:
    head = f"  {label:<7} "
    return textwrap.fill(text, width=WIDTH, initial_indent=head, subsequent_indent=" " * len(head),
                         break_on_hyphens=False, break_long_words=False)


def _evidence_line(ev: Evidence) -> str:
    return f"    {ev.line_no:>5} | {ev.quote()}"


def print_diagnosis(name: str, log: Path, diag: Diagnosis, out: TextIO) -> None:
    print(f"gateway backends diagnose {name}: {log} (last start: {diag.lines} lines)", file=out)
    if diag.ranks:
        world = max(diag.ranks.values())
        print(f"  ranks initialised: {len(diag.ranks)} of {world} ({', '.join(map(str, sorted(diag.ranks)))})",
              file=out)
    root = diag.root
    if root is None and not diag.error_block:
        state = "the server reported it was serving" if diag.started else "the server did not report serving yet"
        print(f"healthy: no error in the last start ({state})", file=out)
    elif root is None and diag.silent:
        print("no error in the log, but the server never reported serving: it is still starting, or it "
              "died without a message (killed? `gateway backends up` reports the exit status); the last lines:",
              file=out)
        for line in diag.error_block:
            print(f"    | {line}", file=out)
    elif root is None:
        print("no known failure signature matched; the last error block:", file=out)
        for line in diag.error_block:
            print(f"    | {line}", file=out)
        print("  (add a signature for it in gateway/launch/signatures.py)", file=out)
    else:
        sig = root.signature
        print(f"DIAGNOSIS: {sig.layer} layer ({LAYERS[sig.layer]}) [{sig.id}]", file=out)
        where = f"line {root.line_no}" + (f", {root.process}" if root.process else "")
        print(f"  first failure ({where}):", file=out)
        print(_evidence_line(root), file=out)
        if len(diag.failed) > 1:
            order = ", ".join(f"{proc} (line {n})" for proc, n in diag.failed)
            print(_wrap("order:", f"processes that failed, first to last: {order}; the root cause is in the "
                        "first, the others only followed"), file=out)
        print(_wrap("cause:", root.cause), file=out)
        print(_wrap("change:", root.change), file=out)
        if sig.kind == "consequence":
            print("  no root cause in the log: this is what the other processes reported; the last error block:",
                  file=out)
            for line in diag.error_block:
                print(f"    | {line}", file=out)
        if diag.related:
            print("  then (follows from the first failure, or fix it next):", file=out)
            for ev in diag.related:
                who = f" [{ev.process}]" if ev.process else ""
                print(f"    {ev.signature.layer}/{ev.signature.id}{who}:", file=out)
                print(_evidence_line(ev), file=out)
    for ev in diag.notes:
        print(f"  note ({ev.signature.layer}/{ev.signature.id}): {ev.cause}; {ev.change}", file=out)
        print(_evidence_line(ev), file=out)


def _ev_dict(ev: Evidence) -> dict[str, object]:
    return {"signature": ev.signature.id, "layer": ev.signature.layer, "kind": ev.signature.kind,
            "line": ev.line_no, "process": ev.process, "evidence": ev.quote(), "cause": ev.cause,
            "change": ev.change}


def as_json(name: str, log: Path, diag: Diagnosis) -> str:
    if diag.healthy:
        verdict = "healthy"
    elif diag.root is not None:
        verdict = "diagnosis"
    else:
        verdict = "silent" if diag.silent else "unknown"
    return json.dumps({
        "upstream": name, "log": str(log), "lines": diag.lines, "status": verdict, "exit": diag.status,
        "root": _ev_dict(diag.root) if diag.root else None,
        "failed_order": [{"process": p, "line": n} for p, n in diag.failed],
        "related": [_ev_dict(e) for e in diag.related], "notes": [_ev_dict(e) for e in diag.notes],
        "error_block": diag.error_block, "ranks": {str(r): w for r, w in sorted(diag.ranks.items())},
        "started": diag.started,
    }, indent=2)


def cmd_diagnose(args: argparse.Namespace) -> int:
    try:
        log = find_log(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        print(f"{args.name}: no log to read: {log}: {exc.strerror or exc} (start it with `gateway backends up "
              f"{args.name}`, or pass a vLLM log with --log FILE)", file=sys.stderr)
        return 2
    if not text.strip():
        print(f"{args.name}: the log {log} is empty", file=sys.stderr)
        return 2
    diag = analyse(text)
    if args.json:
        print(as_json(args.name, log, diag))
        return diag.status
    print_diagnosis(args.name, log, diag, sys.stdout)
    context = launch_context(args)
    if context is not None and not diag.healthy:
        print(_wrap("launch:", context), file=sys.stdout)
    return diag.status


def register(bsub: argparse._SubParsersAction[argparse.ArgumentParser],
             parents: list[argparse.ArgumentParser]) -> None:
    d = bsub.add_parser("diagnose", parents=parents,
                        help="read a backend's vLLM log: the failed layer, the evidence, the change to make",
                        description="Classify why a vLLM backend failed (visibility, communication, split, "
                        "resources, versions, model) from its log. Exit status: 0 healthy, 1 a diagnosis, "
                        "2 no log.")
    d.add_argument("name", metavar="NAME", help="upstream name (used to find its launcher log)")
    d.add_argument("--log", metavar="FILE", help="read this vLLM log instead of the launcher's")
    d.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    d.set_defaults(func=cmd_diagnose)
