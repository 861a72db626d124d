"""``gateway backends ...``: print, start, stop and check the vLLM servers of a config.

    gateway backends command [NAME...] [--show-secrets]   the exact command `up` runs
    gateway backends up [NAME...] [--detach]               start, wait for /health, (stay and) stop on Ctrl-C
    gateway backends down [NAME...]                        stop what `up` started (state file)
    gateway backends status                                what the state file says is running
    gateway backends verify [NAME...]                      probe each upstream like the gateway does
    gateway backends verify --deep NAME                    ranks, GPU memory balance, lengths, determinism
    gateway backends diagnose NAME [--log FILE]            which layer failed, the evidence, the change

The config comes from ``--config``, else ``$GATEWAY_CONFIG``, else ``config/gateway.yaml``. Only
upstreams with a ``launch:`` section can be started; ``verify`` checks every upstream.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from gateway.config import ConfigError, GatewayConfig, UpstreamSpec, load_config
from gateway.launch import diagnose_cli
from gateway.launch.commands import LaunchCommand, LaunchError, build_command
from gateway.launch.deep_verify_cli import run_deep
from gateway.launch.process import (
    DEFAULT_LOG_DIR,
    DEFAULT_STATE_DIR,
    DEFAULT_STOP_TIMEOUT_S,
    BackendProcess,
    LaunchFailed,
    StateFile,
    exit_description,
    start_backend,
    stop_backends,
    stop_records,
    wait_ready,
)
from gateway.routing.probe import ProbeResult, ProbeState, probe_upstream

DEFAULT_CONFIG = "config/gateway.yaml"


class _UsageError(Exception):
    pass


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _out(msg: str) -> None:
    print(msg, flush=True)


def config_path(args: argparse.Namespace) -> str:
    return str(args.config or os.environ.get("GATEWAY_CONFIG") or DEFAULT_CONFIG)


def _load(args: argparse.Namespace) -> GatewayConfig:
    return load_config(config_path(args), os.environ)


def _select(config: GatewayConfig, names: Sequence[str], *, launchable: bool) -> list[UpstreamSpec]:
    """The named upstreams (all when none named); with ``launchable``, only ones with ``launch:``."""
    ups = [u for _, u in config.upstreams()]
    if names:
        chosen = []
        for n in names:
            try:
                _, u = config.upstream(n)
            except KeyError as exc:
                raise _UsageError(str(exc.args[0])) from None
            if launchable and u.launch is None:
                raise _UsageError(f"upstream {n!r} has no `launch:` section; the gateway cannot start it")
            chosen.append(u)
        return chosen
    if launchable:
        ups = [u for u in ups if u.launch is not None]
        if not ups:
            raise _UsageError("no upstream in the config has a `launch:` section")
    elif not ups:
        raise _UsageError("the config has no upstreams")
    return ups


def _commands(ups: Sequence[UpstreamSpec], log_dir: str) -> list[LaunchCommand]:
    try:
        return [build_command(u, log_dir=log_dir) for u in ups]
    except LaunchError as exc:
        raise _UsageError(str(exc)) from None


# --------------------------------------------------------------------------- command


def _cmd_command(args: argparse.Namespace) -> int:
    config = _load(args)
    cmds = _commands(_select(config, args.names, launchable=True), str(args.log_dir))
    _out("\n\n".join(c.render(show_secrets=args.show_secrets) for c in cmds))
    return 0


# --------------------------------------------------------------------------- up / down / status


@contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGINT (even when inherited as ignored, e.g. from a script's background job), SIGTERM and
    SIGHUP all raise KeyboardInterrupt, so every way of stopping the launcher stops the backends."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _print_stops(results: Sequence[Any]) -> None:
    for r in results:
        _out(f"  {r.describe()}")


def _cmd_up(args: argparse.Namespace) -> int:
    config = _load(args)
    cmds = _commands(_select(config, args.names, launchable=True), str(args.log_dir))
    state = StateFile(args.state_dir)
    existing = state.load()
    todo: list[LaunchCommand] = []
    for c in cmds:
        rec = existing.get(c.name)
        if rec is not None and rec.is_running():
            _out(f"{c.name}: already running (pid {rec.pid}, {rec.url}, log {rec.log})")
            continue
        if rec is not None:
            state.remove([c.name])
        todo.append(c)
    if not todo:
        return 0

    started: list[BackendProcess] = []

    def ready(b: BackendProcess) -> None:
        _out(f"{b.name}: ready at {b.command.url} after {b.ready_after_s or 0:.1f} s")

    serving = False  # False while starting: an interrupt then exits 130; while serving it is the normal stop
    with _terminate_as_interrupt():
        try:  # one try for the whole run: an interrupt at any point, even mid-print, stops the backends
            for c in todo:
                b = start_backend(c, state=state, detached=args.detach)
                started.append(b)
                _out(f"{c.name}: starting (pid {b.pid}, {c.url}, log {b.log_path}); waiting for /health")
            wait_ready(started, on_ready=ready)
            if args.detach:
                state_hint = "" if Path(args.state_dir) == DEFAULT_STATE_DIR else f" --state-dir {args.state_dir}"
                _out(f"{len(started)} backend(s) running in the background; stop with: "
                     f"gateway backends down{state_hint}")
                return 0
            serving = True
            running = list(started)
            _out(f"{len(started)} backend(s) running; Ctrl-C stops them")
            while running:
                for b in list(running):
                    code = b.poll()
                    if code is None:
                        continue
                    rec = state.load().get(b.name)
                    if rec is None or rec.pid != b.pid or rec.stopping:
                        _out(f"{b.name}: stopped by `gateway backends down`")
                        running.remove(b)
                        continue
                    _err(f"error: {b.failed(f'the server {exit_description(code)} while serving')}")
                    _out("stopping the backends (and what is left of that one):")
                    _print_stops(stop_backends(running, timeout_s=args.stop_timeout, state=state))
                    return 1
                time.sleep(0.5)
            return 0
        except LaunchFailed as exc:
            _err(f"error: {exc}")
            if exc.log_tail:  # the server ran and wrote a log: `diagnose` can read it
                _err(diagnose_hint(exc.name, args))
            if started:
                _out("stopping what was started:")
                _print_stops(stop_backends(started, timeout_s=args.stop_timeout, state=state))
            return 1
        except KeyboardInterrupt:
            _out("\nstopping backends:" if serving else "\ninterrupted; stopping backends:")
            _print_stops(stop_backends(started, timeout_s=args.stop_timeout, state=state))
            return 0 if serving else 130


def diagnose_hint(name: str, args: argparse.Namespace) -> str:
    """The `diagnose` command line for a backend that failed to start."""
    extra = "".join(f" {flag} {value}" for flag, value in (
        ("--config", args.config), ("--log-dir", None if Path(args.log_dir) == DEFAULT_LOG_DIR else args.log_dir),
        ("--state-dir", None if Path(args.state_dir) == DEFAULT_STATE_DIR else args.state_dir)) if value)
    return f"to see which layer failed and what to change: gateway backends diagnose {name}{extra}"


def _cmd_down(args: argparse.Namespace) -> int:
    state = StateFile(args.state_dir)
    records = state.load()
    if args.names:
        unknown = [n for n in args.names if n not in records]
        for n in unknown:
            _out(f"{n}: not running (no record in {state.path})")
        chosen = [records[n] for n in args.names if n in records]
    else:
        chosen = list(records.values())
    if not chosen:
        if not args.names:
            _out(f"nothing to stop ({state.path} lists no backends)")
        return 0
    with _terminate_as_interrupt():
        _print_stops(stop_records(chosen, timeout_s=args.stop_timeout, state=state))
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    state = StateFile(args.state_dir)
    records = state.load()
    if not records:
        _out(f"no backends recorded in {state.path}")
        return 0
    any_dead = False
    for r in records.values():
        members = r.live_members()
        any_dead |= not members
        what = f"running (pid {r.pid}, {len(members)} processes)" if members else "not running (stale record)"
        _out(f"{r.name}: {what}, {r.url}, log {r.log}")
    return 1 if any_dead else 0


# --------------------------------------------------------------------------- verify

_LABELS = {
    ProbeState.OK: "ok",
    ProbeState.DOWN: "down",
    ProbeState.UNHEALTHY: "unhealthy",
    ProbeState.KEY_MISMATCH: "key mismatch",
    ProbeState.MODEL_MISSING: "model name mismatch",
    ProbeState.ERROR: "error",
    ProbeState.LOCAL_ERROR: "not probed (out of file descriptors here)",
    ProbeState.UNKNOWN: "unknown",
}


async def verify_upstreams(ups: Sequence[UpstreamSpec], timeout_s: float) -> list[ProbeResult]:
    """Probe every upstream concurrently, without environment proxies (like the gateway)."""
    async with httpx.AsyncClient(trust_env=False) as client:
        return list(await asyncio.gather(*(probe_upstream(client, u, timeout_s) for u in ups)))


def describe_probe(upstream: UpstreamSpec, result: ProbeResult) -> str:
    label = _LABELS.get(result.state, result.state.value)
    if result.ok:
        return f"{upstream.name}: ok ({upstream.url} serves {upstream.model!r})"
    return f"{upstream.name}: {label}: {result.detail}"


def _cmd_verify(args: argparse.Namespace) -> int:
    config = _load(args)
    ups = _select(config, args.names, launchable=False)
    if args.deep:
        if len(args.names) != 1:
            raise _UsageError("verify --deep checks one backend: name it (gateway backends verify --deep NAME)")
        return run_deep(ups[0], args)
    results = asyncio.run(verify_upstreams(ups, args.timeout))
    bad = 0
    for u, r in zip(ups, results, strict=True):
        _out(describe_probe(u, r))
        bad += not r.ok
    if bad:
        _err(f"{bad} of {len(ups)} upstream(s) not ok")
        return 1
    return 0


# --------------------------------------------------------------------------- wiring


def _run(func: Any) -> Any:
    def wrapped(args: argparse.Namespace) -> int:
        try:
            rc: int = func(args)
        except ConfigError as exc:
            _err(str(exc))
            return 2
        except _UsageError as exc:
            _err(f"error: {exc}")
            return 2
        return rc

    return wrapped


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "backends",
        help="launch and check vLLM backends",
        description="Print, start, stop and verify the vLLM servers described by `launch:` sections.",
    )
    bsub = p.add_subparsers(dest="backends_command", required=True, metavar="{command,up,down,status,verify,diagnose}")

    cfg = argparse.ArgumentParser(add_help=False)
    cfg.add_argument("--config", help=f"config file (env GATEWAY_CONFIG; default {DEFAULT_CONFIG})")
    logs = argparse.ArgumentParser(add_help=False)
    logs.add_argument("--log-dir", default=str(DEFAULT_LOG_DIR),
                      help=f"where backend logs go unless launch.log_file says (default {DEFAULT_LOG_DIR})")
    st = argparse.ArgumentParser(add_help=False)
    st.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR),
                    help=f"where backends.json records started backends (default {DEFAULT_STATE_DIR})")
    stop = argparse.ArgumentParser(add_help=False)
    stop.add_argument("--stop-timeout", type=float, default=DEFAULT_STOP_TIMEOUT_S,
                      help=f"seconds between SIGTERM and SIGKILL (default {DEFAULT_STOP_TIMEOUT_S:g})")
    names = argparse.ArgumentParser(add_help=False)
    names.add_argument("names", nargs="*", metavar="NAME", help="upstream names (default: all)")

    c = bsub.add_parser("command", parents=[names, cfg, logs],
                        help="print the exact vLLM command (key masked) for upstreams with `launch:`")
    c.add_argument("--show-secrets", action="store_true", help="print the API key instead of masking it")
    c.set_defaults(func=_run(_cmd_command))

    u = bsub.add_parser("up", parents=[names, cfg, logs, st, stop],
                        help="start backends and wait until /health answers; Ctrl-C stops them")
    u.add_argument("--detach", action="store_true",
                   help="return once they are ready and leave them running (stop with `down`)")
    u.set_defaults(func=_run(_cmd_up))

    d = bsub.add_parser("down", parents=[names, st, stop], help="stop backends that `up` started")
    d.set_defaults(func=_run(_cmd_down))

    s = bsub.add_parser("status", parents=[st], help="list backends recorded by `up` and whether they run")
    s.set_defaults(func=_run(_cmd_status))

    v = bsub.add_parser("verify", parents=[names, cfg, logs, st],
                        help="check each upstream: reachable, key accepted, served name present")
    v.add_argument("--timeout", type=float, default=5.0, help="seconds per request (default 5; --deep: connect timeout,"
                   " requests get 12 x, at least 30)")
    v.add_argument("--deep", action="store_true",
                   help="one backend in depth: every rank initialised (log), GPU memory balance (nvidia-smi), "
                   "one request, increasing lengths up to max_model_len, temperature-0 determinism")
    v.set_defaults(func=_run(_cmd_verify))

    diagnose_cli.register(bsub, [cfg, logs, st])
