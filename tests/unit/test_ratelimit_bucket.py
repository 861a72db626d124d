"""Token-bucket invariants under an injected clock (hypothesis): never negative, never above capacity,
refill monotone in time, and all-or-nothing takes."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.ratelimit.bucket import adjust, level_at, wait_ms
from gateway.ratelimit.memory import MemoryLimiter
from gateway.ratelimit.plan import Item

caps = st.integers(min_value=1, max_value=10_000)
rates = st.floats(min_value=1e-6, max_value=10.0, allow_nan=False)
times = st.floats(min_value=0, max_value=1e7, allow_nan=False)


@given(cap=caps, rate=rates, level_frac=st.floats(0, 1), ts=times, t1=times, t2=times)
def test_refill_is_monotone_and_bounded(cap: int, rate: float, level_frac: float, ts: float, t1: float,
                                        t2: float) -> None:
    level = cap * level_frac
    a, b = sorted((t1, t2))
    la, lb = level_at(level, ts, a, cap, rate), level_at(level, ts, b, cap, rate)
    assert 0 <= la <= lb <= cap


@given(cap=caps, level_frac=st.floats(0, 1), delta=st.integers(-20_000, 20_000))
def test_adjust_stays_within_bounds(cap: int, level_frac: float, delta: int) -> None:
    assert 0 <= adjust(cap * level_frac, delta, cap) <= cap


@given(cap=caps, rate=rates, cost=st.integers(1, 10_000))
def test_waiting_wait_ms_makes_the_cost_fit(cap: int, rate: float, cost: int) -> None:
    if cost > cap:
        return
    w = wait_ms(0.0, cost, rate)
    assert level_at(0.0, 0.0, w * (1 + 1e-9) + 1e-9, cap, rate) >= cost * (1 - 1e-9)


ops = st.lists(st.one_of(
    st.tuples(st.just("advance"), st.floats(0, 120_000)),
    st.tuples(st.just("take"), st.integers(0, 3), st.integers(0, 500)),
    st.tuples(st.just("give"), st.integers(0, 3), st.integers(-1000, 1000)),
), max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops=ops, caps_=st.lists(caps, min_size=4, max_size=4))
def test_memory_limiter_levels_stay_in_bounds_and_takes_are_all_or_nothing(ops: list[tuple], caps_: list[int]) -> None:
    now = [0.0]
    lim = MemoryLimiter(clock=lambda: now[0])
    items = [Item(f"b{i}", "tokens", "s", c, c, c / 60_000, False) for i, c in enumerate(caps_)]

    async def levels() -> list[float]:
        return list((await lim.acquire(items, [0] * 4, "p", 1)).levels)

    async def main() -> None:
        for op in ops:
            before = await levels()
            assert all(0 <= lv <= c for lv, c in zip(before, caps_, strict=True))
            if op[0] == "advance":
                now[0] += op[1]
                after = await levels()
                assert all(a >= b for a, b in zip(after, before, strict=True))  # refill is monotone
            elif op[0] == "take":
                costs = [op[2] if i in (op[1], (op[1] + 1) % 4) else 0 for i in range(4)]
                out = await lim.acquire(items, costs, "h", 1)
                after = await levels()
                if out.ok:
                    assert all(abs(b - c - a) < 1e-6 for a, b, c in zip(after, before, costs, strict=True))
                else:
                    assert after == before  # refused: nothing taken anywhere
            else:
                refunds = [op[2] if i == op[1] else 0 for i in range(4)]
                await lim.release(items, refunds, "h")
            assert all(0 <= lv <= c for lv, c in zip(await levels(), caps_, strict=True))

    asyncio.run(main())


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=500), st.floats(min_value=0.0001, max_value=2.0),
       st.lists(st.tuples(st.sampled_from(["take", "give"]), st.integers(min_value=-600, max_value=600),
                          st.floats(min_value=0, max_value=5_000)), max_size=40))
def test_memory_limiter_matches_the_bucket_arithmetic(cap: int, rate: float, ops: list[tuple[str, int, float]]) -> None:
    """The limiter's inlined arithmetic (state cells) == bucket.level_at / adjust applied step by step."""
    now = [1_000.0]
    lim = MemoryLimiter(clock=lambda: now[0])
    item = Item("{k:t}:b", "tokens", "key t", cap, cap, rate, False)
    ref: tuple[float, float] | None = None  # (level, ts); None: full

    def ref_level() -> float:
        return float(cap) if ref is None else level_at(ref[0], ref[1], now[0], cap, rate)

    async def run() -> None:
        nonlocal ref
        for op, amount, dt in ops:
            now[0] += dt
            if op == "take":
                cost = abs(amount)
                out = await lim.acquire([item], [cost], "h", 1000)
                expected = ref_level()
                assert out.ok == (expected >= cost)
                assert abs(out.levels[0] - (expected - cost if out.ok else expected)) < 1e-6
                if out.ok:
                    ref = (expected - cost, now[0])
            else:
                await lim.release([item], [amount], "h")
                if amount:
                    ref = (adjust(ref_level(), amount, cap), now[0])

    asyncio.run(run())


kinds = st.sampled_from(["requests", "tokens", "parallel"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(kinds, st.integers(min_value=1, max_value=50), st.floats(min_value=0.0001, max_value=2.0)),
                min_size=1, max_size=5),
       st.lists(st.tuples(st.sampled_from(["take", "give"]), st.integers(min_value=-60, max_value=60),
                          st.floats(min_value=0, max_value=300), st.integers(min_value=0, max_value=5)),
                max_size=50))
def test_compiled_program_is_the_loop(spec: list[tuple[str, int, float]],
                                      ops: list[tuple[str, int, float, int]]) -> None:
    """take/give (generated straight-line code) == acquire_now/release_now (the loops), on every step:
    same outcome, same levels, same failing item, same gate holds, on two limiters fed the same ops."""
    now = [1_000.0]
    loop_lim, prog_lim = MemoryLimiter(clock=lambda: now[0]), MemoryLimiter(clock=lambda: now[0])
    items = tuple(Item(f"i{n}", kind, "s", cap, cap, 0.0 if kind == "parallel" else rate, False)  # type: ignore[arg-type]
                  for n, (kind, cap, rate) in enumerate(spec))
    prog = prog_lim.program(items)
    assert prog_lim.program(items) is prog  # compiled once per item list
    loop_lim._cells(items)  # both with their (full, empty) state created up front
    held: list[int] = []
    for n, (op, amount, dt, pick) in enumerate(ops):
        now[0] += dt
        if op == "take":
            est = abs(amount)
            costs = [est if i.kind == "tokens" else 1 for i in items]
            a = loop_lim.acquire_now(items, costs, n, 500)  # type: ignore[arg-type]  # any hashable hold
            b = prog.take(est, n, 500)
            assert (a.ok, a.failed) == (b.ok, b.failed)
            assert a.levels == b.levels
            if a.ok:
                held.append(n)
        elif held:
            hold = held.pop(pick % len(held))
            loop_lim.release_now(items, [amount if i.kind == "tokens" else 0 for i in items], hold)  # type: ignore[arg-type]
            prog.give(amount, hold)
        assert loop_lim._buckets == prog_lim._buckets  # the same operations in the same order: exact
        assert loop_lim._gates == prog_lim._gates
