"""The circuit breaker as a pure state machine, its board, and the retry policy (pure functions)."""

from __future__ import annotations

import random

import pytest

from gateway.domain import Upstream
from gateway.errors import (
    EndpointNotSupported,
    UpstreamAuthFailed,
    UpstreamBadResponse,
    UpstreamError,
    UpstreamRejected,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from gateway.routing.breaker import Breaker, BreakerBoard, CircuitState, Transition
from gateway.routing.health import HealthBoard
from gateway.routing.probe import ProbeResult, ProbeState
from gateway.upstream.retry import backoff_s, judge


def test_opens_after_consecutive_failures_only() -> None:
    b = Breaker(failures=3, cool_down_s=10)
    assert b.failure(0, "x") is None and b.failure(0, "x") is None
    assert b.success() is None  # a success resets the count
    assert b.failure(1, "a") is None and b.failure(1, "b") is None
    t = b.failure(2, "connect")
    assert t == Transition(CircuitState.CLOSED, CircuitState.OPEN, "3 consecutive failures, last: connect")
    assert b.state is CircuitState.OPEN and not b.available(2) and not b.available(11.9)


def test_half_open_lets_exactly_one_trial_then_closes_on_success() -> None:
    b = Breaker(failures=1, cool_down_s=5)
    b.failure(100, "reset")
    assert b.acquire(104.9) == (False, None)
    ok, t = b.acquire(105)
    assert ok and t is not None and t.new is CircuitState.HALF_OPEN
    assert b.acquire(105.1) == (False, None) and not b.available(106)  # one trial at a time
    t2 = b.success()
    assert t2 is not None and (t2.old, t2.new) == (CircuitState.HALF_OPEN, CircuitState.CLOSED)
    assert b.acquire(106) == (True, None)


def test_failed_trial_opens_again_for_another_cool_down() -> None:
    b = Breaker(failures=2, cool_down_s=5)
    b.failure(0, "x")
    b.failure(0, "x")
    assert b.acquire(5)[0]
    t = b.failure(6, "http_503")
    assert t is not None and t.new is CircuitState.OPEN and "trial request failed" in t.why
    assert not b.available(10.9) and b.available(11)


def test_released_trial_frees_the_slot_and_probe_closes_from_any_state() -> None:
    b = Breaker(failures=1, cool_down_s=1)
    b.failure(0, "x")
    assert b.acquire(1)[0]
    b.release()  # the client left: says nothing about the backend
    assert b.state is CircuitState.HALF_OPEN and b.acquire(1)[0]
    b.failure(1, "x")
    t = b.probe_ok()
    assert t is not None and t.why == "health probe succeeded" and b.state is CircuitState.CLOSED


def test_board_add_remove_listeners_and_unknown_names() -> None:
    now = [0.0]
    seen: list[tuple[str, CircuitState]] = []
    board = BreakerBoard(["a"], failures=1, cool_down_s=2, clock=lambda: now[0])
    board.listeners.append(lambda n, t: seen.append((n, t.new)))
    board.add(["b", "a"])  # runtime addition; "a" keeps its state
    board.failure("a", "connect")
    assert board.state("a") is CircuitState.OPEN and board.open_for("a") == 2
    assert not board.available("a") and board.available("b") and board.available("never-heard-of")
    now[0] = 2.0
    assert board.acquire("a") and board.state("a") is CircuitState.HALF_OPEN
    board.success("a")
    board.remove(["a"])
    assert board.names() == ["b"] and board.available("a")
    assert seen == [("b", CircuitState.CLOSED), ("a", CircuitState.OPEN), ("a", CircuitState.HALF_OPEN),
                    ("a", CircuitState.CLOSED)]


def test_health_board_folds_the_circuit_into_usable_and_a_probe_closes_it() -> None:
    breakers = BreakerBoard(["a"], failures=1, cool_down_s=60)
    board = HealthBoard(["a"], breakers)
    assert board.usable("a")
    breakers.failure("a", "x")
    assert not board.usable("a")
    board.set("a", ProbeResult(ProbeState.OK, "ok"))
    assert board.usable("a") and breakers.state("a") is CircuitState.CLOSED


_UP = Upstream("u", "m", "http://x", "tiny", None, 1)  # type: ignore[arg-type]


@pytest.mark.parametrize(("err", "status", "reason", "same", "failure"), [
    (UpstreamUnavailable("refused"), None, "connect", True, True),
    (UpstreamUnavailable("t", code="upstream_connect_timeout"), None, "connect", True, True),
    (UpstreamError("reset", code="upstream_disconnected"), None, "reset", True, True),
    (UpstreamUnavailable("503"), 503, "http_503", True, True),
    (UpstreamError("502", code="upstream_error"), 502, "http_502", True, True),
    (UpstreamError("504", code="upstream_error"), 504, "http_504", True, True),
    (UpstreamRejected("slow down", status=429), 429, "http_429", True, False),
    (UpstreamError("500", code="upstream_error"), 500, "http_500", False, True),  # engine dead: other backend only
    (UpstreamAuthFailed("key"), 401, "http_401", False, False),
    (EndpointNotSupported("no"), 404, "http_404", False, False),
    (UpstreamRejected("bad", status=400), 400, None, False, False),  # the request's own fault: never
    (UpstreamBadResponse("405"), 405, None, False, False),
])
def test_retry_policy(err: UpstreamError, status: int | None, reason: str | None, same: bool, failure: bool) -> None:
    v = judge(err, status)
    assert (v.reason, v.same_upstream_ok, v.backend_failure) == (reason, same, failure)


def test_no_retry_after_a_timeout_once_sent_but_it_counts_against_the_backend() -> None:
    v = judge(UpstreamTimeout("slow"), None, sent_timeout=True)
    assert v.reason is None and v.backend_failure


def test_backoff_is_full_jitter_exponential_and_capped_by_the_deadline() -> None:
    rng = random.Random(7)
    waits = [backoff_s(3, 50, 10.0, rng) for _ in range(2000)]
    assert 0 <= min(waits) < 0.01 and 0.19 < max(waits) <= 0.2  # uniform over [0, 50ms * 2**2]
    assert 0.08 < sum(waits) / len(waits) < 0.12
    assert backoff_s(10, 50, 0.03, rng) <= 0.03  # never past the request's deadline
    assert backoff_s(1, 50, 0.0) == 0.0 and backoff_s(2, 0, 5.0) == 0.0
