"""The rate-limit step alone, in one process: what in-memory limits add to a request, without a server.

The step is what ``api/proxy.py`` does for a limited key: find the plan, estimate the tokens, admit
(take from every bucket and the gate), build the ``x-ratelimit-*`` headers, and after the answer settle
(free the gate, reconcile the tokens). The bench key's limits (``BENCH_LIMITS``: rpm, tpm and
max_parallel that never refuse) are the ones ``bench_proxy.py`` and ``bench_instructions.py`` use.

    .venv/bin/python loadtest/bench_limitstep.py                 # ns per step (noisy on a shared machine)
    .venv/bin/python loadtest/bench_limitstep.py --instructions  # instructions per step under callgrind:
        # two runs (N steps, 0 steps; the same start-up and warm-up), the difference over N (~1 minute)
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.api.dialect import OpenAIDialect
from gateway.config.schema import GatewayConfig, LimitSpec, RateLimitsSpec
from gateway.domain import ModelEntry
from gateway.mappings.snapshot import ModelTable
from gateway.ratelimit.estimate import estimate_openai
from gateway.ratelimit.memory import MemoryLimiter
from gateway.ratelimit.service import RateLimits
from loadtest.bench.targets import BENCH_LIMITS

OPENAI = OpenAIDialect()
BODY = b'{"model":"bench-model","messages":[{"role":"user","content":"Say hello in five words."}],"max_tokens":16}'


class _Key:
    name = "bench"
    limits = LimitSpec(**BENCH_LIMITS)
    per_model: dict[str, LimitSpec] = {}


def _entry() -> ModelEntry:
    cfg = GatewayConfig.model_validate({"models": [{"id": "bench-model", "upstreams": [
        {"name": "u", "url": "http://127.0.0.1:9", "model": "bench-model"}]}]})
    return ModelTable.from_config(cfg).entries["bench-model"]  # the entry as the gateway builds it


async def run(steps: int) -> float:
    limits = RateLimits(RateLimitsSpec(), MemoryLimiter(), hold_ms=660_000, shared=False)
    key, entry = _Key(), _entry()
    payload: dict[str, Any] = {"model": "bench-model", "messages": [], "max_tokens": 16}
    default = limits.spec.default_max_tokens
    t0 = time.perf_counter()
    for _ in range(steps):
        plan = limits.plan(key, entry)
        assert plan is not None
        estimate = estimate_openai("chat", payload, len(BODY), default, entry.max_model_len)
        ticket = await limits.admit(plan, estimate)
        headers = ticket.headers
        if headers:
            OPENAI.rate_headers(headers)
        limits.settle(ticket, 25)
    return time.perf_counter() - t0


def _instructions(steps: int) -> int:
    """Total instructions of this script run with ``--steps steps`` under callgrind."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-instr=no",
                        sys.executable, __file__, "--steps", str(steps)],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for line in out.read_text(errors="replace").splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError("no callgrind totals")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--instructions", action="store_true",
                    help="count instructions per step under valgrind's callgrind instead of timing")
    args = ap.parse_args()
    if args.instructions:
        if shutil.which("valgrind") is None:
            sys.exit("valgrind is not installed (apt-get install valgrind)")
        n = min(args.steps, 20_000)
        per = (_instructions(n) - _instructions(0)) / n
        print(f"{n} steps: {per / 1000:.1f} k instructions per step")
        return
    asyncio.run(run(1000))  # warm-up: plan cached, cells resolved
    elapsed = asyncio.run(run(args.steps))
    if args.steps:
        print(f"{args.steps} steps: {elapsed / args.steps * 1e9:.0f} ns per step")


if __name__ == "__main__":
    main()
