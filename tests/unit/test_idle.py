from __future__ import annotations

import asyncio

import pytest

from gateway.upstream.idle import IdleTimer


async def _chunks(gaps: list[float], idle: float = 0.5, total: float = 0.6) -> int:
    """Read 'chunks' arriving after the given gaps; returns how many arrived before the timer fired."""
    loop = asyncio.get_running_loop()
    timer = IdleTimer(idle, loop.time() + total)
    got = 0
    try:
        for gap in gaps:
            await asyncio.sleep(gap)
            timer.touch()
            got += 1
    except asyncio.CancelledError:
        if not timer.absorb():
            raise
        return -got - 1
    finally:
        timer.stop()
    return got


def test_steady_chunks_never_trip_it() -> None:
    assert asyncio.run(_chunks([0.02] * 10, total=5.0)) == 10  # never 0.5 s of silence


def test_silence_trips_it_and_the_task_is_not_left_cancelled() -> None:
    async def go() -> None:
        assert await _chunks([0.02, 0.02, 2.0], total=5.0) == -3  # two chunks, then silence
        await asyncio.sleep(0)  # the task goes on normally afterwards
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0

    asyncio.run(go())


def test_total_deadline_trips_it_even_with_steady_chunks() -> None:
    got = asyncio.run(_chunks([0.1] * 30))  # 3 s of steady chunks against a 0.6 s total
    assert got < 0 and -got - 1 < 30


def test_other_cancellations_pass_through() -> None:
    async def go() -> None:
        task = asyncio.create_task(_chunks([0.05] * 100))
        await asyncio.sleep(0.12)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())


async def _blocked_send(block: float, idle: float, stall: float, total: float = 30.0) -> tuple[bool, bool]:
    """One chunk arrives, then handing it to the client blocks for ``block`` seconds.
    Returns (cut, cut as the client's stall)."""
    loop = asyncio.get_running_loop()
    timer = IdleTimer(idle, loop.time() + total, stall)
    try:
        timer.touch()
        timer.sending()
        await asyncio.sleep(block)  # a client that does not read
        timer.touch()
        await asyncio.sleep(idle / 4)  # and the upstream carries on normally
    except asyncio.CancelledError:
        if not timer.absorb():
            raise
        return True, timer.client_stalled
    finally:
        timer.stop()
    return False, False


def test_time_blocked_on_the_client_is_not_upstream_silence() -> None:
    assert asyncio.run(_blocked_send(block=1.0, idle=0.2, stall=5.0)) == (False, False)


def test_a_client_stalled_beyond_its_limit_is_reported_as_such() -> None:
    assert asyncio.run(_blocked_send(block=5.0, idle=0.2, stall=0.6)) == (True, True)


def test_the_total_deadline_still_applies_while_blocked_on_the_client() -> None:
    assert asyncio.run(_blocked_send(block=5.0, idle=0.2, stall=10.0, total=0.6)) == (True, False)
