"""The rate limiter's precomputed hot path agrees with the plain definitions it replaces.

- plan_headers (per-plan header groups, preformatted limits) == rate_headers (the definition);
- the pre-encoded EVALSHA commands == a plain RESP encoding of the scripts' arguments;
- the RESP reply parser gives the same values however the bytes are split across reads;
- usage counters' field names follow the UTC hour and day of an injected clock.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config.schema import LimitSpec
from gateway.ratelimit.plan import build_plan
from gateway.ratelimit.redis_limiter import _SHA, _args, _Encoded
from gateway.ratelimit.resp import RespError, _Conn, command
from gateway.ratelimit.service import plan_headers, rate_headers
from gateway.ratelimit.usage import UsageRecorder

PLAN = build_plan("team-a", "big-70b", LimitSpec(rpm=600, tpm=200000, max_parallel=16),
                  LimitSpec(rpm=60, tpm=90000, burst_requests=6), LimitSpec(tpm=500000, rpm=300))
assert PLAN is not None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(min_value=-5, max_value=600_000, allow_nan=False), min_size=7, max_size=7))
def test_plan_headers_are_rate_headers(levels: list[float]) -> None:
    assert PLAN is not None
    lv = tuple(levels)
    assert sorted(plan_headers(PLAN, lv)) == sorted(rate_headers(PLAN.items, lv))


SINGLE = build_plan("team-b", "small-7b", LimitSpec(rpm=600, tpm=200000, max_parallel=16, burst_tokens=5000),
                    None, None)
assert SINGLE is not None and SINGLE.header_single is not None and PLAN.header_single is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(min_value=-5, max_value=600_000, allow_nan=False), min_size=3, max_size=3))
def test_one_bucket_per_kind_headers_are_rate_headers(levels: list[float]) -> None:
    assert SINGLE is not None
    lv = tuple(levels)
    assert sorted(plan_headers(SINGLE, lv)) == sorted(rate_headers(SINGLE.items, lv))


def test_plan_precomputes_costs_and_refunds() -> None:
    assert PLAN is not None
    kinds = [i.kind for i in PLAN.items]
    assert PLAN.costs(123) == tuple(123 if k == "tokens" else 1 for k in kinds)
    assert PLAN.refunds(-7) == tuple(-7 if k == "tokens" else 0 for k in kinds)
    only_rpm = build_plan("k", "m", LimitSpec(rpm=5), None, None)
    assert only_rpm is not None and only_rpm.costs(999) == (1,)


@settings(deadline=None)
@given(st.integers(min_value=0, max_value=10**9), st.sampled_from([0, 1, 60_000, 660_000]))
def test_encoded_commands_are_plain_resp(estimate: int, hold_ms: int) -> None:
    assert PLAN is not None
    enc = _Encoded(PLAN.items)
    keys = [i.key for i in PLAN.items]
    costs = PLAN.costs(estimate)
    assert enc.acquire(costs, "h0ld", hold_ms) == command(
        "EVALSHA", _SHA["a"], len(keys), *keys, "h0ld", hold_ms, *_args(PLAN.items, costs))
    refunds = PLAN.refunds(estimate - 5)
    assert enc.release(refunds, "h0ld") == command(
        "EVALSHA", _SHA["r"], len(keys), *keys, "h0ld", *_args(PLAN.items, refunds))


REPLIES = (b"*5\r\n:1\r\n:0\r\n$3\r\n599\r\n$14\r\n199481.3333333\r\n$2\r\n15\r\n"
           b"-NOSCRIPT No matching script. Please use EVAL.\r\n"
           b":1\r\n+OK\r\n$-1\r\n*2\r\n*1\r\n$0\r\n\r\n:-3\r\n*0\r\n")
EXPECTED = [[1, 0, b"599", b"199481.3333333", b"15"], "NOSCRIPT", 1, b"OK", None, [[b""], -3], []]


def _feed(chunks: list[bytes]) -> list[object]:
    got: list[object] = []

    async def main() -> None:
        conn = _Conn()
        for _ in EXPECTED:
            conn.waiters.append(got.append)
        for c in chunks:
            conn.data_received(c)

    asyncio.run(main())
    return [str(g).split(" ")[0] if isinstance(g, RespError) else g for g in got]


def test_replies_parse_whole_and_split_at_every_byte() -> None:
    assert _feed([REPLIES]) == EXPECTED
    for cut in range(1, len(REPLIES)):
        assert _feed([REPLIES[:cut], REPLIES[cut:]]) == EXPECTED, cut
    assert _feed([REPLIES[i:i + 1] for i in range(len(REPLIES))]) == EXPECTED


def test_usage_field_names_follow_the_utc_hour_and_day() -> None:
    now = [datetime(2026, 3, 1, 22, 59, 59, tzinfo=UTC).timestamp()]
    rec = UsageRecorder(client=object(), clock=lambda: now[0])  # type: ignore[arg-type]  # never flushed here
    rec.record("team-a", "m", 10, 2)
    now[0] += 1  # 23:00:00
    rec.record("team-a", "m", 1, 1)
    rec.refused("team-a", "m")
    now[0] += 3600  # next day, 00:00:00
    rec.record("team-a", "m", 5, 0)
    now[0] -= 7200  # a clock that goes back: 22:00:00 the first day
    rec.record("team-a", "other", 3, 3)
    assert {k: dict(v) for k, v in rec._pending.items()} == {
        ("team-a", "2026-03-01"): {"m|22|req": 1, "m|22|pt": 10, "m|22|ct": 2, "m|23|req": 1, "m|23|pt": 1,
                                   "m|23|ct": 1, "m|23|rl": 1, "other|22|req": 1, "other|22|pt": 3,
                                   "other|22|ct": 3},
        ("team-a", "2026-03-02"): {"m|00|req": 1, "m|00|pt": 5},
    }
