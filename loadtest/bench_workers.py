"""Two checks of issue 11 that the proxy benchmark does not make: `--workers 2` against one worker, and RSS
over a mixed soak.

    .venv/bin/python loadtest/bench_workers.py                 # both: scaling, then a 300 s soak
    .venv/bin/python loadtest/bench_workers.py --soak-s 0      # scaling only
    .venv/bin/python loadtest/bench_workers.py --rounds 0 --soak-s 60

Scaling: the same fast stub behind two `gateway serve` processes, one with one worker and one with
`--workers 2`, case B's load (non-streaming chat, concurrency 64) in alternating rounds; nothing is pinned
(two workers need both cores), so the load generator and the stub share the cores with the gateway and the
ratio is a lower bound of what two workers give on their own cores.

Soak: one gateway (one worker), a mixed load (non-streaming chat and 32-chunk streams, concurrency 32 each)
for `--soak-s` seconds, the gateway's RSS read from /proc every 10 s; reports the RSS after the first
interval (warm), at the end and its largest value, and the drift from warm to end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadtest.bench import targets as tg
from loadtest.bench.loadgen import RunResult, perf, run_load
from loadtest.bench.scenarios import CLIENT_KEY, PUBLIC_MODEL, Target, make_scenario


def rss_kib(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def start_gateway(procs: tg.Procs, stub_port: int, tmp: Path, name: str, workers: int) -> tg.Started:
    port = tg.free_port()
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(json.dumps(tg.gateway_config(stub_port), indent=2))
    cmd = [*tg.gateway_cmd(), "serve", "--config", str(cfg), "--host", tg.HOST, "--port", str(port)]
    if workers > 1:
        cmd += ["--workers", str(workers)]
    proc = procs.start(name, cmd, env=tg.gateway_env(None))
    return tg.Started(name, port, proc, [proc.pid])


def tree(pid: int) -> list[int]:
    return [pid, *tg.child_pids(pid)]


async def scaling(procs: tg.Procs, stub: tg.Started, tmp: Path, rounds: int, requests: int) -> dict[str, Any]:
    gws = {n: start_gateway(procs, stub.port, tmp, f"gateway-{n}w", n) for n in (1, 2)}
    for n, s in gws.items():
        await tg.wait_ready(f"gateway-{n}w", s.proc, s.port, tg.ready_requests("gateway", s.port), procs)
    scs = {n: make_scenario("chat", Target(f"gateway-{n}w", s.port, CLIENT_KEY, PUBLIC_MODEL, PUBLIC_MODEL), 16, 0)
           for n, s in gws.items()}  # fmt: skip
    for n, s in gws.items():  # warm-up: connections, caches, both workers
        await run_load(scs[n], s.port, 640, 64, {}, 30.0)
    rps: dict[int, list[float]] = {1: [], 2: []}
    cpu: dict[int, list[float]] = {1: [], 2: []}
    errors = 0
    for r in range(rounds):
        for n, s in gws.items():
            res = RunResult.of("chat", f"gateway-{n}w", 64, await run_load(scs[n], s.port, requests, 64,
                                                                             {"gw": tree(s.proc.pid)}, 30.0))
            rps[n].append(res.rps)
            cpu[n].append(res.cpu_ms_per_req.get("gw", float("nan")))
            errors += res.errors
            print(f"round {r}: --workers {n}: {res.rps:8.1f} req/s, p50 {res.latency_ms['p50']:.2f} ms, "
                  f"gateway CPU {cpu[n][-1]:.3f} ms/req, {res.errors} errors", flush=True)
    total = {n: sum(v) / len(v) for n, v in rps.items()}
    ratio = total[2] / total[1]
    print(f"--workers 2 / --workers 1: {ratio:.2f}x ({total[2]:.0f} / {total[1]:.0f} req/s, mean of {rounds} "
          f"rounds), {errors} errors", flush=True)
    return {"rps": rps, "cpu_ms_per_req": cpu, "ratio": round(ratio, 3), "errors": errors}


async def soak(procs: tg.Procs, stub: tg.Started, tmp: Path, seconds: float) -> dict[str, Any]:
    s = start_gateway(procs, stub.port, tmp, "gateway-soak", 1)
    await tg.wait_ready("gateway-soak", s.proc, s.port, tg.ready_requests("gateway", s.port), procs)
    t = Target("gateway-soak", s.port, CLIENT_KEY, PUBLIC_MODEL, PUBLIC_MODEL)
    stop_at = perf() + seconds
    loads = [asyncio.create_task(run_load(make_scenario(kind, t, 32 if kind == "stream" else 16, 0), s.port,
                                          10**9, 32, {}, 30.0, stop_at))
             for kind in ("chat", "stream")]  # fmt: skip
    samples: list[tuple[float, int]] = []
    t0 = perf()
    while perf() < stop_at:
        await asyncio.sleep(min(10.0, max(0.0, stop_at - perf())))
        samples.append((round(perf() - t0, 1), rss_kib(tree(s.proc.pid))))
        print(f"soak {samples[-1][0]:6.1f} s: RSS {samples[-1][1] / 1024:.1f} MiB", flush=True)
    raws = await asyncio.gather(*loads)
    ok, errors = sum(r.ok for r in raws), sum(r.errors for r in raws)
    warm, end, peak = samples[0][1], samples[-1][1], max(v for _, v in samples)
    drift = (end - warm) / warm
    print(f"soak: {ok} requests, {errors} errors; RSS warm {warm / 1024:.1f} MiB, end {end / 1024:.1f} MiB, "
          f"max {peak / 1024:.1f} MiB, drift {drift:+.1%}", flush=True)
    return {"requests": ok, "errors": errors, "rss_kib": samples, "drift": round(drift, 4)}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        procs = tg.Procs(tmp)
        try:
            stub = tg.start_stub(procs, tg.Pinning(None, None))
            await tg.wait_ready("stub", stub.proc, stub.port, tg.ready_requests("stub", stub.port), procs)
            if args.rounds:
                out["scaling"] = await scaling(procs, stub, tmp, args.rounds, args.requests)
            if args.soak_s:
                out["soak"] = await soak(procs, stub, tmp, args.soak_s)
        finally:
            procs.stop_all()
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=4, help="alternating scaling rounds (0: skip)")
    p.add_argument("--requests", type=int, default=3000, help="requests per gateway and round")
    p.add_argument("--soak-s", type=float, default=300.0, help="soak length in seconds (0: skip)")
    p.add_argument("--json", type=Path, help="write the results here")
    a = p.parse_args()
    result = asyncio.run(main(a))
    if a.json:
        a.json.write_text(json.dumps(result, indent=2))
