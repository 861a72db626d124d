"""Instructions per request of the gateway without limits, with in-memory limits and with Redis limits
(and, when asked, of the Python floor and of another revision's gateway), counted by valgrind's
callgrind: a measure that a shared, noisy machine does not move.

Each gateway runs under ``valgrind --tool=callgrind`` (about 50x slower, so the load is small and
the concurrency low); after a warm-up its counters are zeroed (``callgrind_control -z``), a fixed
number of non-streaming requests is sent, and the counters are dumped (``callgrind_control -d``):
instructions per request = the dump's total / requests. CPU time per request (``bench_proxy.py``)
is the real cost; this is the same comparison without the neighbours' noise. See loadtest/README.md.

    .venv/bin/python loadtest/bench_instructions.py                  # about 4 minutes
    .venv/bin/python loadtest/bench_instructions.py --requests 500   # quicker
    .venv/bin/python loadtest/bench_instructions.py --targets floor,gateway --baseline HEAD  # issue 11
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `loadtest.bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadtest.bench import targets as tg
from loadtest.bench.loadgen import run_load
from loadtest.bench.scenarios import CLIENT_KEY, PUBLIC_MODEL, SERVED_MODEL, Target, make_scenario

TARGETS = ("gateway", "gateway-memlimits", "gateway-redislimits")
KNOWN = (*TARGETS, "floor", "gateway-base")  # floor: loadtest/floor_relay.py; gateway-base: --baseline REV


def _total_ir(dump_dir: Path, name: str) -> int:
    """Instructions in the latest callgrind dump of ``name`` (its ``summary:``/``totals:`` line)."""
    dumps = sorted(dump_dir.glob(f"cg-{name}.*"), key=lambda p: p.stat().st_mtime)
    for path in reversed(dumps):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError(f"no callgrind totals for {name} in {dump_dir}")


async def _control(flag: str, pid: int) -> None:
    proc = await asyncio.create_subprocess_exec("callgrind_control", flag, str(pid), stdout=subprocess.DEVNULL,
                                                stderr=subprocess.DEVNULL)
    async with asyncio.timeout(120):
        if await proc.wait() != 0:
            raise RuntimeError(f"callgrind_control {flag} {pid} failed")


async def measure(name: str, procs: tg.Procs, pin: tg.Pinning, tmp: Path, stub_port: int, redis_url: str | None,
                  requests: int, concurrency: int, base_src: Path | None = None) -> dict[str, Any]:
    valgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg-{name}.%p", "--dump-instr=no"]
    if name == "floor":
        s = tg.start_floor(procs, pin, stub_port, wrapper=valgrind)
        target = Target(name, s.port, CLIENT_KEY, PUBLIC_MODEL, SERVED_MODEL)  # the floor maps no model back
    else:
        s = tg.start_gateway(procs, pin, stub_port, tmp, redis_url if name == "gateway-redislimits" else None,
                             access_log=False, name=name, limits=name in TARGETS[1:], wrapper=valgrind,
                             src=base_src if name == "gateway-base" else None)
        target = Target(name, s.port, CLIENT_KEY, PUBLIC_MODEL, PUBLIC_MODEL)
    ready_as = "floor" if name == "floor" else "gateway"
    await tg.wait_ready(name, s.proc, s.port, tg.ready_requests(ready_as, s.port), procs, timeout_s=600)
    sc = make_scenario("chat", target, 16, 0.0)
    warm = await run_load(sc, s.port, max(100, requests // 4), concurrency, {}, 120)
    await _control("-z", s.proc.pid)  # zero the counters: start-up and warm-up do not count
    raw = await run_load(sc, s.port, requests, concurrency, {}, 120)
    await _control("-d", s.proc.pid)  # dump what the measured requests cost
    ir = _total_ir(tmp, name)  # before the exit, which writes a dump of its own
    s.proc.terminate()
    await asyncio.to_thread(s.proc.wait, 120)
    if raw.errors or warm.errors:
        raise RuntimeError(f"{name}: {raw.errors + warm.errors} errors ({raw.first_error or warm.first_error})")
    return {"target": name, "requests": raw.ok, "instructions": ir, "per_request": ir / raw.ok}


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="bench-instr-") as tmp_s:
        tmp = Path(tmp_s)
        procs = tg.Procs(tmp)
        try:
            pin = tg.plan_pinning(not args.no_pin)
            stub = tg.start_stub(procs, pin)
            await tg.wait_ready("stub", stub.proc, stub.port, tg.ready_requests("stub", stub.port), procs)
            redis = await tg.start_redis(procs, pin, tmp) if "gateway-redislimits" in args.targets else None
            url = f"redis://{tg.HOST}:{redis.port}/0" if redis is not None else None
            base_src = tg.export_revision(args.baseline, tmp / "base-src") if args.baseline else None
            rows = []
            for name in args.targets:
                row = await measure(name, procs, pin, tmp, stub.port, url, args.requests, args.concurrency,
                                    base_src)
                print(f"{name:<20} {row['per_request']:>12,.0f} instructions/request ({row['requests']} requests)",
                      flush=True)
                rows.append(row)
            return rows
        finally:
            procs.stop_all()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=1000, help="measured requests per gateway (default 1000)")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--targets", default=",".join(TARGETS))
    p.add_argument("--no-pin", action="store_true")
    p.add_argument("--baseline", metavar="REV", help="also measure the gateway of git revision REV (gateway-base)")
    args = p.parse_args()
    args.targets = [t for t in args.targets.split(",") if t]
    if args.baseline and "gateway-base" not in args.targets:
        args.targets.append("gateway-base")
    unknown = [t for t in args.targets if t not in KNOWN] + (
        ["gateway-base (needs --baseline REV)"] if "gateway-base" in args.targets and not args.baseline else [])
    if unknown:
        print(f"unknown targets {unknown}; choose from {', '.join(KNOWN)}", file=sys.stderr)
        return 2
    if not shutil.which("valgrind") or not shutil.which("callgrind_control"):
        print("valgrind (callgrind) not found: apt-get install valgrind", file=sys.stderr)
        return 2
    rows = asyncio.run(main_async(args))
    by = {r["target"]: r for r in rows}
    for ref, title in (("gateway", "the gateway without limits"), ("floor", "the Python floor"),
                       ("gateway-base", f"the gateway of {args.baseline}")):
        if ref in by and len(rows) > 1:
            print(f"\ninstructions per request, ratio to {title}:")
            for r in rows:
                print(f"  {r['target']:<20} {r['per_request'] / by[ref]['per_request']:.3f}")
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
