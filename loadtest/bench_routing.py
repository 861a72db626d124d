"""What load-aware routing costs: gateway CPU per request with `routing: load_aware` against `weighted`,
in the same run, over 4 upstreams.

Four fast stubs (`upstream_stub.py`, each serving a real-size vLLM `/metrics` page with its live
in-flight count) and two gateways (`gateway serve`), identical but for the model's `routing`; the
load_aware one scrapes the four `/metrics` pages every `metrics_interval_s` (0.5 s) in the background,
and that work is counted in its CPU. Non-streaming chat at concurrency 64, rounds alternating between
the two so that machine noise hits both alike. Goal (issue 9): load_aware's CPU per request within
10 % of weighted's. About 30-50 s with the defaults.

    .venv/bin/python loadtest/bench_routing.py [--requests 2000] [--rounds 3] [--concurrency 64] [--no-pin]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadtest.bench import targets as tg
from loadtest.bench.loadgen import HttpConn, Raw, RunResult, run_load
from loadtest.bench.scenarios import (
    CLIENT_KEY,
    HOST,
    PUBLIC_MODEL,
    SERVED_MODEL,
    STUB_KEY,
    Target,
    http_request,
    make_scenario,
)

UPSTREAMS = 4
STRATEGIES = ("weighted", "load_aware")
GOAL = 1.10


def routing_config(stub_ports: Sequence[int], routing: str) -> dict[str, Any]:
    cfg = tg.gateway_config(stub_ports[0])
    cfg["models"][0]["routing"] = routing
    cfg["models"][0]["upstreams"] = [
        {"name": f"stub{i}", "url": f"http://{HOST}:{p}", "model": SERVED_MODEL, "api_key": STUB_KEY}
        for i, p in enumerate(stub_ports)
    ]
    cfg["routing"] = {"metrics_interval_s": 0.5, "metrics_stale_s": 3}
    return cfg


async def served(stubs: Sequence[tg.Started]) -> list[int]:
    """Chat requests each stub has answered so far."""
    out = []
    for s in stubs:
        conn = await HttpConn.open(s.port)
        try:
            status, body = await conn.exchange(http_request("GET", "/stub/served", s.port, None))
        finally:
            conn.close()
        out.append(int(json.loads(body)["chat"]) if status == 200 else -1)
    return out


def start_gateway(procs: tg.Procs, pin: tg.Pinning, stub_ports: Sequence[int], tmp: Path, routing: str) -> tg.Started:
    port = tg.free_port()
    cfg = tmp / f"gateway-{routing}.yaml"
    cfg.write_text(json.dumps(routing_config(stub_ports, routing), indent=2))  # JSON is YAML
    proc = procs.start(f"gateway-{routing}", [*tg.gateway_cmd(), "serve", "--config", str(cfg), "--host", HOST,
                                              "--port", str(port)], env=tg.gateway_env(None), cpus=pin.proxies)
    return tg.Started(routing, port, proc, [proc.pid])


async def bench(args: argparse.Namespace, procs: tg.Procs, tmp: Path) -> dict[str, Any]:
    pin = tg.plan_pinning(not args.no_pin)
    if pin.load:
        os.sched_setaffinity(0, pin.load)
    stubs = []
    for i in range(UPSTREAMS):
        s = tg.start_stub(procs, pin)
        s.name = f"stub{i}"
        stubs.append(s)
    for s in stubs:
        await tg.wait_ready("stub", s.proc, s.port, tg.ready_requests("stub", s.port), procs)
    gateways = {r: start_gateway(procs, pin, [s.port for s in stubs], tmp, r) for r in STRATEGIES}
    for r, g in gateways.items():
        took = await tg.wait_ready(f"gateway-{r}", g.proc, g.port, tg.ready_requests("gateway", g.port), procs)
        print(f"ready: gateway ({r}) :{g.port} ({took:.2f} s)", flush=True)
    targets = {r: Target(r, g.port, CLIENT_KEY, PUBLIC_MODEL, PUBLIC_MODEL) for r, g in gateways.items()}
    scs = {r: make_scenario("chat", t, 16, 0.0) for r, t in targets.items()}
    for r, t in targets.items():  # warm-up
        await run_load(scs[r], t.port, 4 * args.concurrency, args.concurrency, {}, 30.0)
    acc = {r: Raw() for r in STRATEGIES}
    spread = {r: [0] * UPSTREAMS for r in STRATEGIES}
    for _ in range(args.rounds):
        for r, t in targets.items():
            before = await served(stubs)
            acc[r].merge(await run_load(scs[r], t.port, args.requests, args.concurrency,
                                        {"proxy": gateways[r].pids}, 30.0))
            spread[r] = [a + n - b for a, n, b in zip(spread[r], await served(stubs), before, strict=True)]
    rows = {r: RunResult.of("chat", r, args.concurrency, acc[r]) for r in STRATEGIES}
    print(f"\n{'routing':<11} {'requests':>8} {'errors':>6} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'gateway CPU ms/req':>18}")
    for r, row in rows.items():
        print(f"{r:<11} {row.requests:>8} {row.errors:>6} {row.rps:>8.0f} {row.latency_ms['p50']:>7.2f} "
              f"{row.latency_ms['p99']:>7.2f} {row.cpu_ms_per_req.get('proxy', float('nan')):>18.3f}   "
              f"per upstream: {' / '.join(map(str, spread[r]))}")
    w = rows["weighted"].cpu_ms_per_req.get("proxy")
    la = rows["load_aware"].cpu_ms_per_req.get("proxy")
    ratio = la / w if w and la else None
    if ratio is not None:
        print(f"\nload_aware / weighted CPU per request: {ratio:.3f} "
              f"(goal <= {GOAL:.2f}: {'met' if ratio <= GOAL else 'NOT met'})")
    return {"rows": {r: row.__dict__ for r, row in rows.items()}, "ratio": ratio, "spread": spread,
            "errors": sum(row.errors for row in rows.values())}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    p.add_argument("--requests", type=int, default=2000, help="requests per gateway and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--no-pin", action="store_true", help="do not pin the gateways to the last CPU")
    args = p.parse_args(argv)
    print(f"bench_routing: {UPSTREAMS} upstreams, {args.rounds} rounds x {args.requests} requests per strategy, "
          f"concurrency {args.concurrency}, load average {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-routing-") as tmp:
        procs = tg.Procs(Path(tmp))
        try:
            result = asyncio.run(bench(args, procs, Path(tmp)))
        except (RuntimeError, OSError) as exc:
            print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        finally:
            logs = {r: procs.log_tail(f"gateway-{r}", 10) for r in STRATEGIES}
            procs.stop_all()
    for r, tail in logs.items():
        if tail.strip():
            print(f"\ngateway ({r}) log, last lines:\n{tail}")
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
