"""One contract, two limiters: the in-memory one (injected clock) and the Redis one (a real redis-server).

``advance(ms)`` moves the memory limiter's clock; for Redis it lets real time pass (Redis TIME is the
clock there), so time-dependent assertions are lower bounds that hold on a loaded machine too.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import pytest

from gateway.ratelimit.limiter import Outcome, RateLimiter
from gateway.ratelimit.memory import MemoryLimiter
from gateway.ratelimit.plan import Item
from gateway.ratelimit.redis_limiter import RedisLimiter
from gateway.redis_client import connect
from tests.support.redis_server import RedisServer

SLOW = 1 / 60_000  # one token a minute: no refill during a test


@dataclass
class Harness:
    name: Literal["memory", "redis", "redis-py"]
    make: Callable[[], RateLimiter]
    advance: Callable[[float], Awaitable[None]]
    server: RedisServer | None = None


@pytest.fixture(params=["memory", "redis", "redis-py"])  # redis: the lean RESP connection; redis-py: its scripts
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    if request.param == "memory":
        now = [1_000_000.0]

        async def advance_clock(ms: float) -> None:
            now[0] += ms

        yield Harness("memory", lambda: MemoryLimiter(clock=lambda: now[0]), advance_clock)
        return
    server: RedisServer = request.getfixturevalue("redis_server")

    async def sleep(ms: float) -> None:
        await asyncio.sleep(ms / 1000)

    lean = request.param == "redis"

    def make() -> RedisLimiter:
        lim = RedisLimiter(connect(server.url, 5.0), clustered=False, lean=lean)
        assert (lim.lean is not None) is lean
        return lim

    yield Harness(request.param, make, sleep, server)


def bucket(name: str, capacity: int, rate: float = SLOW, kind: Any = "requests") -> Item:
    return Item(f"{{k:t}}:{name}", kind, f"key {name}", capacity, capacity, rate, False)


def gate(name: str, capacity: int) -> Item:
    return Item(f"{{k:t}}:{name}", "parallel", f"key {name}", capacity, capacity, 0.0, False)


def run(h: Harness, body: Callable[[RateLimiter], Awaitable[None]]) -> None:
    async def main() -> None:
        limiter = h.make()
        try:
            await body(limiter)
        finally:
            await limiter.aclose()

    asyncio.run(main())


def hold() -> str:
    return os.urandom(4).hex()


def test_takes_until_empty_then_refuses_with_levels(harness: Harness) -> None:
    b = bucket("rq", 5)

    async def body(lim: RateLimiter) -> None:
        levels = [(await lim.acquire([b], [1], hold(), 60_000)).levels[0] for _ in range(5)]
        assert [round(x) for x in levels] == [4, 3, 2, 1, 0]
        refused = await lim.acquire([b], [1], hold(), 60_000)
        assert not refused.ok and refused.failed == 0 and refused.levels[0] < 1

    run(harness, body)


def test_all_or_nothing_across_buckets(harness: Harness) -> None:
    a, b = bucket("a", 10), bucket("b", 2, kind="tokens")

    async def body(lim: RateLimiter) -> None:
        assert (await lim.acquire([a, b], [1, 2], hold(), 60_000)).ok
        refused = await lim.acquire([a, b], [1, 1], hold(), 60_000)
        assert (refused.ok, refused.failed) == (False, 1)
        after = await lim.acquire([a], [1], hold(), 60_000)  # `a` lost nothing to the refused request
        assert after.ok and round(after.levels[0]) == 8

    run(harness, body)


def test_gate_admits_capacity_and_release_frees_a_slot(harness: Harness) -> None:
    g = gate("pl", 2)

    async def body(lim: RateLimiter) -> None:
        h1, h2 = hold(), hold()
        assert (await lim.acquire([g], [1], h1, 60_000)).ok
        assert (await lim.acquire([g], [1], h2, 60_000)).levels == (0.0,)
        refused = await lim.acquire([g], [1], hold(), 60_000)
        assert (refused.ok, refused.levels) == (False, (0.0,))
        await lim.release([g], [0], h1)
        assert (await lim.acquire([g], [1], hold(), 60_000)).ok

    run(harness, body)


def test_a_lost_hold_lapses_after_hold_ms(harness: Harness) -> None:
    g = gate("pl", 1)

    async def body(lim: RateLimiter) -> None:
        assert (await lim.acquire([g], [1], hold(), 100)).ok  # never released (an instance died)
        assert not (await lim.acquire([g], [1], hold(), 100)).ok
        await harness.advance(150)
        assert (await lim.acquire([g], [1], hold(), 100)).ok

    run(harness, body)


def test_refund_and_charge_stay_within_zero_and_capacity(harness: Harness) -> None:
    t = bucket("tk", 100, kind="tokens")

    async def probe(lim: RateLimiter) -> float:
        out: Outcome = await lim.acquire([t], [0], hold(), 60_000)
        return out.levels[0]

    async def body(lim: RateLimiter) -> None:
        assert round((await lim.acquire([t], [60], hold(), 60_000)).levels[0]) == 40
        await lim.release([t], [30], "x")
        assert round(await probe(lim)) == 70
        await lim.release([t], [1000], "x")
        assert await probe(lim) == 100
        await lim.release([t], [-500], "x")
        assert 0 <= await probe(lim) < 1

    run(harness, body)


def test_refill_over_time(harness: Harness) -> None:
    rate = 1 / 100  # one request per 100 ms
    b = bucket("rq", 2, rate)

    async def body(lim: RateLimiter) -> None:
        t0 = time.monotonic()
        assert (await lim.acquire([b], [2], hold(), 60_000)).ok
        assert not (await lim.acquire([b], [1], hold(), 60_000)).ok or time.monotonic() - t0 >= 0.1
        await harness.advance(250)
        out = await lim.acquire([b], [0], hold(), 60_000)
        assert 2 >= out.levels[0] >= 2.0 - 1e-9 if harness.name == "memory" else out.levels[0] >= 1.5

    run(harness, body)


def test_concurrent_takes_admit_exactly_the_capacity(harness: Harness) -> None:
    b = bucket("rq", 37)

    async def body(lim: RateLimiter) -> None:
        outs = await asyncio.gather(*(lim.acquire([b], [1], hold(), 60_000) for _ in range(120)))
        assert sum(o.ok for o in outs) == 37

    run(harness, body)


def test_redis_survives_script_flush_and_restart(redis_server: RedisServer) -> None:
    b = bucket("rq", 3)

    async def main() -> None:
        lim = RedisLimiter(connect(redis_server.url, 5.0), clustered=False)
        try:
            assert (await lim.acquire([b], [1], hold(), 60_000)).ok
            redis_server.cli("SCRIPT", "FLUSH")
            assert round((await lim.acquire([b], [1], hold(), 60_000)).levels[0]) == 1  # reloaded, state kept
            redis_server.restart()  # data and scripts gone: the bucket starts full again
            outs = [await lim.acquire([b], [1], hold(), 60_000) for _ in range(4)]
            assert [o.ok for o in outs] == [True, True, True, False]
            ttl = int(redis_server.cli("PTTL", b.key).strip())
            assert 0 < ttl <= 3 * 60_000 + 1000  # idle buckets expire once they would be full again
        finally:
            await lim.aclose()

    asyncio.run(main())


def test_lean_redis_call_times_out_on_a_paused_redis_and_the_connection_recovers(redis_server: RedisServer) -> None:
    b = bucket("rq", 100)

    async def main() -> None:
        lim = RedisLimiter(connect(redis_server.url, 0.3), clustered=False)
        assert lim.lean is not None and lim.lean.timeout_s == 0.3  # the client's socket timeout
        try:
            assert (await lim.acquire([b], [1], hold(), 60_000)).ok
            redis_server.cli("CLIENT", "PAUSE", "3000", "ALL")
            try:
                t0 = time.monotonic()
                with pytest.raises(TimeoutError):
                    await lim.acquire([b], [1], hold(), 60_000)
                assert time.monotonic() - t0 < 2.0  # its deadline (0.3 s, plus a loaded machine), not the pause
            finally:
                redis_server.cli("CLIENT", "UNPAUSE")
            # the late reply is read and dropped: the same connection answers the next call correctly
            out = await lim.acquire([b], [1], hold(), 60_000)
            assert out.ok and round(out.levels[0]) == 97  # Redis ran the timed-out take too, late
        finally:
            await lim.aclose()

    asyncio.run(main())
