"""The load itself: `concurrency` workers per phase, bounded by a request count or a deadline.

With one target the run is one phase. With two (--compare) the run alternates rounds, A then B
then A..., so both endpoints see the same load under the same machine conditions; each target's
rates are computed over the time its own rounds took (`active_s`). Setting `stop` (Ctrl-C) cancels
the requests in flight at once; they are left out of the results.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gateway.loadtool.client import RequestResult, Sender

ResultSink = Callable[[RequestResult], None]


@dataclass(frozen=True)
class Plan:
    concurrency: int
    requests: int | None = None  # per target; exactly one of requests / duration_s is set
    duration_s: float | None = None  # for the whole run
    round_size: int | None = None  # requests per round when comparing (default: see `rounds_of`)

    def __post_init__(self) -> None:
        if (self.requests is None) == (self.duration_s is None):
            raise ValueError("a load is bounded by a request count or a duration (exactly one)")
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.requests is not None and self.requests < 1:
            raise ValueError("the request count must be at least 1")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError("the duration must be positive")

    def rounds_of(self) -> int:
        """Requests per round when comparing: at most 8 rounds per target, never below `concurrency`."""
        if self.round_size is not None:
            return max(1, self.round_size)
        if self.requests is not None:
            return max(self.concurrency, math.ceil(self.requests / 8))
        return self.concurrency * 4


@dataclass
class RunRecord:
    results: list[RequestResult] = field(default_factory=list)
    active_s: list[float] = field(default_factory=list)  # per target: time its phases took
    elapsed_s: float = 0.0
    interrupted: bool = False


async def run_load(senders: Sequence[Sender], plan: Plan, stop: asyncio.Event, sink: ResultSink,
                   clock_zero: float) -> RunRecord:  # fmt: skip
    """Run the plan against every sender; `sink` sees each result as it arrives."""
    record = RunRecord(active_s=[0.0] * len(senders))

    def keep(result: RequestResult) -> None:
        record.results.append(result)
        sink(result)

    deadline = clock_zero + plan.duration_s if plan.duration_s is not None else None
    remaining = [plan.requests] * len(senders)
    round_size = plan.rounds_of() if len(senders) > 1 else None
    turn = 0
    while not stop.is_set():
        if deadline is not None and time.perf_counter() >= deadline:
            break
        if all(r == 0 for r in remaining):
            break
        i = turn % len(senders)
        turn += 1
        left = remaining[i]
        if left == 0:
            continue
        count = left if round_size is None else (round_size if left is None else min(round_size, left))
        t0 = time.perf_counter()
        done = await _phase(senders[i], plan.concurrency, count, deadline, stop, keep)
        record.active_s[i] += time.perf_counter() - t0
        if left is not None:
            remaining[i] = left - done
    record.elapsed_s = time.perf_counter() - clock_zero
    record.interrupted = stop.is_set()
    return record


async def _phase(sender: Sender, concurrency: int, count: int | None, deadline: float | None,
                 stop: asyncio.Event, keep: ResultSink) -> int:  # fmt: skip
    """`count` requests (None: until `deadline`) with `concurrency` workers; returns how many finished."""
    claimed = 0
    finished = 0

    def claim() -> bool:
        nonlocal claimed
        if stop.is_set() or (count is not None and claimed >= count):
            return False
        if deadline is not None and time.perf_counter() >= deadline:
            return False
        claimed += 1
        return True

    async def worker() -> None:
        nonlocal finished
        while claim():
            result = await sender.send()
            finished += 1
            keep(result)

    n_workers = concurrency if count is None else min(concurrency, count)
    workers = [asyncio.create_task(worker()) for _ in range(n_workers)]
    stopper = asyncio.create_task(stop.wait())
    try:
        pending: set[asyncio.Future[None] | asyncio.Task[bool]] = {*workers, stopper}
        while any(not w.done() for w in workers) and not stop.is_set():
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
        for w in workers:
            w.cancel()
        await asyncio.gather(stopper, *workers, return_exceptions=True)
    for w in workers:  # a bug in a worker must not vanish silently
        if not w.cancelled() and w.exception() is not None:
            raise w.exception()  # type: ignore[misc]
    return finished
