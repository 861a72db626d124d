"""Proxy benchmark: the same load directly against a fast vLLM-like stub and through nginx, the Python
floor and the gateway, in the same run, alternating rounds so machine noise hits all alike.

Cases (issue 11's table; `loadtest/bench/scenarios.py`):
  A  non-streaming, concurrency 1: added p50 (target minus direct)
  B  non-streaming, concurrency 64: req/s, and the proxy's CPU per request
  C  32-chunk streams, concurrency 64: chunks/s
  D  200 concurrent streams, 20 ms per chunk: added time-to-first-chunk p99

Rate limits (issue 7): `--targets gateway,gateway-memlimits,gateway-redislimits` adds gateways whose
key has limits that never refuse (in memory; in a redis-server the benchmark starts), and prints their
CPU per request and req/s as ratios to the gateway without limits, per round and overall
(`make bench-ratelimit`).

Every response is checked (status, complete body, the model name, SSE event count); a slow stream
first checks that every proxy relays incrementally. Prints the rows per case and then the gateway's
cost as ratios to direct, nginx and the floor; writes `var/bench/results-<timestamp>.json`.
`--profile` adds a py-spy profile of the gateway. See loadtest/README.md.

    .venv/bin/python loadtest/bench_proxy.py            # make bench: about 2 minutes
    .venv/bin/python loadtest/bench_proxy.py --quick    # under a minute
    .venv/bin/python loadtest/bench_proxy.py --cases B --targets gateway,gateway-memlimits,gateway-redislimits
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import signal
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `loadtest.bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadtest.bench import targets as tg
from loadtest.bench.loadgen import Raw, RunResult, run_load, verify_stream
from loadtest.bench.profiling import find_py_spy, profile_gateway
from loadtest.bench.report import (
    HEADER,
    _finite,
    baseline_summary,
    case_summary,
    git_rev,
    limits_summary,
    machine_info,
    print_baseline_summary,
    print_limits_summary,
    print_profile,
    print_rows,
    print_summary,
)
from loadtest.bench.scenarios import (
    CASES,
    CLIENT_KEY,
    PUBLIC_MODEL,
    SERVED_MODEL,
    STUB_KEY,
    Target,
    make_scenario,
)

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "var" / "bench"
ALL_TARGETS = ("direct", "nginx", "floor", "gateway", "gateway-log", "gateway-memlimits", "gateway-redislimits")
LIMIT_TARGETS = ("gateway-memlimits", "gateway-redislimits")  # issue 7: compared with "gateway"
DEFAULT_TARGETS = ("direct", "nginx", "floor", "gateway")
BASE_TARGET = "gateway-base"  # --baseline REV: that revision's gateway, for a before/after in one run


@dataclass
class Options:
    cases: list[str]
    targets: list[str]
    scale: float
    rounds: int
    timeout_s: float
    pin: bool
    install_nginx: bool
    verify_tokens: int
    verify_delay_ms: float
    profile: bool
    profile_seconds: float
    profile_scenario: str
    profile_target: str
    redis_url: str | None
    quick: bool
    write_json: bool
    baseline: str | None = None  # a git revision: its gateway runs as target "gateway-base"


Found = list[tuple[Target, list[int]]]  # a target and the processes whose CPU counts


async def start_targets(opts: Options, procs: tg.Procs, pin: tg.Pinning, tmp: Path,
                        out: dict[str, Any]) -> tuple[tg.Started, tg.Started | None, Found]:  # fmt: skip
    stub = tg.start_stub(procs, pin)
    redis: tg.Started | None = None
    if "gateway-redislimits" in opts.targets:
        redis = await tg.start_redis(procs, pin, tmp)
        print(f"ready: redis-server :{redis.port}", flush=True)
    await tg.wait_ready("stub", stub.proc, stub.port, tg.ready_requests("stub", stub.port), procs)
    found: Found = []
    for name in opts.targets:
        if name == "direct":
            found.append((Target("direct", stub.port, STUB_KEY, SERVED_MODEL, SERVED_MODEL), []))
            continue
        if name == "nginx":
            binary, why = tg.find_nginx(opts.install_nginx)
            if binary is None:
                print(f"nginx: skipped ({why})", flush=True)
                out["skipped"] = {"nginx": why}
                continue
            s = tg.start_nginx(procs, pin, binary, stub.port, tmp)
            target = Target("nginx", s.port, STUB_KEY, SERVED_MODEL, SERVED_MODEL)
        elif name == "floor":
            s = tg.start_floor(procs, pin, stub.port)
            target = Target("floor", s.port, CLIENT_KEY, PUBLIC_MODEL, SERVED_MODEL)
        elif name == BASE_TARGET:
            assert opts.baseline is not None
            src = tg.export_revision(opts.baseline, tmp / "base-src")
            s = tg.start_gateway(procs, pin, stub.port, tmp, opts.redis_url, access_log=False, name=name, src=src)
            target = Target(name, s.port, CLIENT_KEY, PUBLIC_MODEL, PUBLIC_MODEL)
        elif name in LIMIT_TARGETS:
            url = f"redis://{tg.HOST}:{redis.port}/0" if redis is not None and name == "gateway-redislimits" else None
            s = tg.start_gateway(procs, pin, stub.port, tmp, url, access_log=False, name=name, limits=True)
            target = Target(name, s.port, CLIENT_KEY, PUBLIC_MODEL, PUBLIC_MODEL)
        else:
            s = tg.start_gateway(procs, pin, stub.port, tmp, opts.redis_url, access_log=name == "gateway-log",
                                 name=name)
            target = Target(name, s.port, CLIENT_KEY, PUBLIC_MODEL, PUBLIC_MODEL)
        ready_as = "gateway" if name in ("gateway-log", BASE_TARGET) else name
        took = await tg.wait_ready(name, s.proc, s.port, tg.ready_requests(ready_as, s.port), procs)
        pids = tg.child_pids(s.proc.pid) if name == "nginx" else s.pids  # nginx: the worker does the work
        print(f"ready: {name} :{s.port} ({took:.2f} s)", flush=True)
        found.append((target, pids or s.pids))
    return stub, redis, found


async def bench(opts: Options, procs: tg.Procs, tmp: Path, stamp: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    pin = tg.plan_pinning(opts.pin)
    if pin.load:
        os.sched_setaffinity(0, pin.load)  # the load generator
    out["pinning"] = {"proxies": sorted(pin.proxies or ()), "load": sorted(pin.load or ())}
    stub, redis, targets = await start_targets(opts, procs, pin, tmp, out)

    checks = [await verify_stream(t, opts.verify_tokens, opts.verify_delay_ms, opts.timeout_s) for t, _ in targets]
    out["stream_check"] = checks
    for v in checks:
        state = "ok" if v["ok"] else f"FAILED: {v['problem']}"
        print(f"incremental stream via {v['target']}: {v['pieces']} pieces, first {v['first_piece_ms']:.1f} ms, "
              f"last {v['last_piece_ms']:.1f} ms: {state}", flush=True)

    runs: list[RunResult] = []
    summary: list[dict[str, Any]] = []
    print(f"\n{HEADER}", flush=True)
    for name in opts.cases:
        case = CASES[name]
        per_round = max(case.concurrency, int(case.requests * opts.scale))
        scs = {t.name: make_scenario(case.scenario, t, case.tokens, case.delay_ms) for t, _ in targets}
        for t, _ in targets:  # warm-up: connections, pools, caches
            await run_load(scs[t.name], t.port, max(2 * case.concurrency, 50), case.concurrency, {}, opts.timeout_s)
        acc = {t.name: Raw() for t, _ in targets}
        rounds: dict[str, list[RunResult]] = {t.name: [] for t, _ in targets}
        for _ in range(opts.rounds):  # alternate so that noise hits every target alike
            for t, pids in targets:
                cpu_of = {"stub": stub.pids, **({"proxy": pids} if pids else {}),
                          **({"redis": redis.pids} if redis is not None else {})}
                one = await run_load(scs[t.name], t.port, per_round, case.concurrency, cpu_of, opts.timeout_s)
                rounds[t.name].append(RunResult.of(case.name, t.name, case.concurrency, one))
                acc[t.name].merge(one)
        rows = [RunResult.of(case.name, t.name, case.concurrency, acc[t.name]) for t, _ in targets]
        runs += rows
        print_rows(case, rows)
        summary += case_summary(case, rows)
        if case.metric == "rps" and "gateway" in rounds and any(n in rounds for n in LIMIT_TARGETS):
            lines = limits_summary(case.name, rows, rounds)
            for line in lines:  # requests served unlimited (fail_open) did not pay for the limits
                port = next(t.port for t, _ in targets if t.name == line["target"])
                line["limiter_failures_total"] = await tg.metric_value(port, "gateway_rate_limiter_errors_total")
            out.setdefault("ratelimit", []).extend(lines)
            print_limits_summary(lines)
        if "gateway" in rounds and BASE_TARGET in rounds:
            line = baseline_summary(case.name, rows, rounds, opts.baseline or "")
            out.setdefault("baseline", []).append(line)
            print_baseline_summary(line)
    out["runs"] = [asdict(r) for r in runs]
    out["summary"] = summary
    print_summary(summary, [t.name for t, _ in targets])

    gateway = next(((t, p) for t, p in targets if t.name == opts.profile_target), None)
    if opts.profile and gateway is not None:
        out["profile"] = await _profile(opts, gateway[0], gateway[1][0], stamp)
    return out


async def _profile(opts: Options, gateway: Target, pid: int, stamp: str) -> dict[str, Any]:
    py_spy = find_py_spy()
    if py_spy is None:
        print("--profile: py-spy not found; `make install` installs it (dev extra)", flush=True)
        return {"error": "py-spy not found"}
    conc = 64
    path = RESULTS_DIR / f"profile-{stamp}.txt"
    name = opts.profile_scenario
    print(f"\nprofiling the gateway (py-spy, {opts.profile_seconds:g} s of {name} load at concurrency {conc}) ...",
          flush=True)
    sc = make_scenario(name, gateway, 32 if name == "stream" else 16, 0.0)
    try:
        raw, prof = await profile_gateway(py_spy, pid, sc, gateway.port, conc, opts.profile_seconds, path,
                                          opts.timeout_s)
    except (RuntimeError, OSError, TimeoutError) as exc:
        print(f"profiling failed: {type(exc).__name__}: {exc}", flush=True)
        return {"error": f"{type(exc).__name__}: {exc}"}
    r = RunResult.of(name, "gateway+py-spy", conc, raw)
    result = {"file": str(path.relative_to(ROOT)), "run": asdict(r), **prof}
    print_profile(result)
    return result


def _list(text: str, allowed: Sequence[str], what: str) -> list[str]:
    items = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in items if s not in allowed]
    if unknown or not items:
        raise SystemExit(f"unknown {what} {unknown}; choose from {', '.join(allowed)}")
    return items


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="The gateway's cost against direct, nginx and a minimal Python relay.")
    p.add_argument("--cases", default=",".join(CASES), help="comma list of A,B,C,D,E (default all)")
    p.add_argument("--targets", default=",".join(DEFAULT_TARGETS),
                   help=f"comma list of {', '.join(ALL_TARGETS)} (default {','.join(DEFAULT_TARGETS)}; "
                   "gateway-log: a second gateway with its access log on)")
    p.add_argument("--scale", type=float, help="multiply every case's request count (default 1; quick 0.25)")
    p.add_argument("--rounds", type=int, help="alternating rounds per case (default 2; quick 1)")
    p.add_argument("--timeout", type=float, default=30.0, help="per-request timeout in seconds")
    p.add_argument("--no-pin", action="store_true", help="do not pin proxies and load generator to CPUs")
    p.add_argument("--no-install-nginx", action="store_true", help="skip nginx when it is not installed")
    p.add_argument("--profile", action="store_true", help="profile the gateway with py-spy afterwards")
    p.add_argument("--profile-seconds", type=float, default=15.0, help="length of the profiled load")
    p.add_argument("--profile-scenario", choices=("chat", "stream"), default="chat")
    p.add_argument("--profile-target", choices=[t for t in ALL_TARGETS if t.startswith("gateway")],
                   default="gateway", help="the gateway to profile (default gateway)")
    p.add_argument("--redis-url", help="GATEWAY_REDIS_URL for the gateway (default: none)")
    p.add_argument("--quick", action="store_true", help="a short run: a quarter of the requests, one round")
    p.add_argument("--no-json", action="store_true", help="do not write var/bench/results-*.json")
    p.add_argument("--baseline", metavar="REV",
                   help="also run the gateway of git revision REV (target gateway-base) and print this "
                        "gateway's CPU per request as a ratio to it, per round (a before/after in one run)")
    return p


def options_from(args: argparse.Namespace) -> Options:
    q = args.quick
    opts = Options(
        cases=_list(args.cases, tuple(CASES), "cases"),
        targets=_list(args.targets, ALL_TARGETS, "targets"),
        scale=args.scale or (0.25 if q else 1.0),
        rounds=args.rounds or (1 if q else 2),
        timeout_s=args.timeout,
        pin=not args.no_pin,
        install_nginx=not args.no_install_nginx,
        verify_tokens=8,
        verify_delay_ms=20.0,
        profile=args.profile,
        profile_seconds=min(args.profile_seconds, 5.0) if q else args.profile_seconds,
        profile_scenario=args.profile_scenario,
        profile_target=args.profile_target,
        redis_url=args.redis_url,
        quick=q,
        write_json=not args.no_json,
        baseline=args.baseline,
    )
    if opts.baseline and BASE_TARGET not in opts.targets:
        opts.targets.append(BASE_TARGET)
    if "direct" not in opts.targets:
        opts.targets.insert(0, "direct")  # every number is relative to it
    if opts.scale <= 0 or opts.rounds < 1:
        raise SystemExit("--scale and --rounds must be positive")
    return opts


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    def handler(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _runner() -> asyncio.Runner:
    try:
        import uvloop
    except ImportError:
        return asyncio.Runner()
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)


def main(argv: Sequence[str] | None = None) -> int:
    opts = options_from(build_parser().parse_args(argv))
    started = dt.datetime.now(dt.UTC)
    stamp = started.strftime("%Y%m%d-%H%M%S")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    print(f"bench_proxy {started:%Y-%m-%d %H:%M:%S}Z: {os.cpu_count()} CPUs, cases {','.join(opts.cases)}, "
          f"targets {','.join(opts.targets)}, scale {opts.scale:g}, rounds {opts.rounds}, "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as tmp, sigterm_as_interrupt():
        procs = tg.Procs(Path(tmp))
        try:
            with _runner() as runner:
                result = runner.run(bench(opts, procs, Path(tmp), stamp))
            gw_log = "\n".join(t for n in ("gateway", *LIMIT_TARGETS) if (t := procs.log_tail(n, 20)).strip())
        except KeyboardInterrupt:
            print("\ninterrupted; stopping the servers", file=sys.stderr)
            return 130
        except (RuntimeError, OSError) as exc:
            print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
            for name in ("gateway", *LIMIT_TARGETS, "redis", "floor", "nginx", "stub"):
                if tail := procs.log_tail(name, 10):
                    print(f"{name} log:\n{tail}", file=sys.stderr)
            return 1
        finally:
            procs.stop_all()
    if gw_log.strip():
        print(f"\ngateway log (warnings and errors, last lines):\n{gw_log}")
    doc = {"started": started.isoformat(), "machine": machine_info(), "gateway_rev": git_rev(),
           "options": asdict(opts), **result}
    if opts.write_json:
        path = RESULTS_DIR / f"results-{stamp}.json"
        path.write_text(json.dumps(_finite(doc), indent=2, default=str) + "\n")
        print(f"\nresults: {path.relative_to(ROOT)}")
    failed = [v for v in result["stream_check"] if not v["ok"]]
    errors = sum(r["errors"] for r in result["runs"])
    if failed or errors:
        print(f"FAILED: {len(failed)} stream checks, {errors} request errors", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
