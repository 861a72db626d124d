"""What the request path calls: admit a request (or refuse it with OpenAI's 429), settle it after.

``admit`` takes from every bucket the request touches in one limiter call and returns a
:class:`Ticket` with OpenAI's ``x-ratelimit-*`` headers; ``settle`` (where the response ends, whatever
the outcome) frees the request's in-flight slots and gives back or charges the difference between the
token estimate and the real usage, in the background. A limiter that fails or answers slower than
``redis_timeout_ms`` is a failure: ``fail_open`` serves (counted, logged once per interval),
``fail_closed`` answers 503 ``rate_limiter_unavailable``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from typing import NoReturn, Protocol

from gateway.config.schema import LimitSpec, RateLimitsSpec
from gateway.domain import ModelEntry
from gateway.errors import LimiterUnavailable, RateLimited
from gateway.ratelimit.bucket import full_in_ms, wait_ms
from gateway.ratelimit.limiter import LimiterFailure, Outcome, RateLimiter
from gateway.ratelimit.memory import Give, MemoryLimiter
from gateway.ratelimit.plan import Item, Plan, build_plan
from gateway.ratelimit.redis_limiter import RedisLimiter

log = logging.getLogger("gateway.ratelimit")

Header = tuple[bytes, bytes]
MAX_RETRY_AFTER_S = 60  # older SDKs ignore longer waits
_FAILURE_LOG_INTERVAL_S = 30.0
_NAMES = {
    "requests": (b"x-ratelimit-limit-requests", b"x-ratelimit-remaining-requests", b"x-ratelimit-reset-requests"),
    "tokens": (b"x-ratelimit-limit-tokens", b"x-ratelimit-remaining-tokens", b"x-ratelimit-reset-tokens"),
}
_UNIT = {"requests": "rpm", "tokens": "tpm", "parallel": "max_parallel"}


class Limited(Protocol):
    """The caller as the limiter sees it (an authenticated key)."""

    @property
    def name(self) -> str: ...
    @property
    def limits(self) -> LimitSpec | None: ...
    @property
    def per_model(self) -> Mapping[str, LimitSpec]: ...


def openai_duration(ms: float) -> str:
    """OpenAI's reset format: ``20ms``, ``1.2s``, ``6m0s``, ``1h2m3s``."""
    total = max(0, math.ceil(ms))
    if total < 1000:
        return f"{total}ms"
    hours, rest = divmod(total, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    if not hours and not minutes:
        return f"{secs}s"
    return (f"{hours}h" if hours else "") + f"{minutes}m{secs}s"


_SHORT = [b"%dms" % n for n in range(1000)]  # resets under a second, the usual case: no formatting


def _reset(ms: float) -> bytes:
    if ms < 999.0:
        return _SHORT[max(0, math.ceil(ms))]
    return openai_duration(ms).encode()


def plan_headers(plan: Plan, levels: tuple[float, ...]) -> list[Header]:
    """:func:`rate_headers` from the plan's precomputed header groups (the per-request path)."""
    out: list[Header] = []
    single = plan.header_single
    if single is not None:  # one bucket per kind: no choosing
        for n_limit, n_remaining, n_reset, i, limit, cap, rate in single:
            level = levels[i]
            full = (cap - level) / rate if level < cap else 0.0  # a bucket's rate is > 0 (rpm, tpm >= 1)
            out += ((n_limit, limit), (n_remaining, b"%d" % (int(level) if level > 0 else 0)),
                    (n_reset, _SHORT[math.ceil(full)] if full < 999.0 else _reset(full)))
        return out
    for names, cands in plan.header_groups:  # the tightest bucket of each kind; on a tie, the smallest limit
        best = cands[0]
        level = levels[best[0]]
        remaining = int(level) if level > 0 else 0
        if len(cands) > 1:
            for c in cands:
                lv = levels[c[0]]
                r = int(lv) if lv > 0 else 0
                if r < remaining or (r == remaining and c[1] < best[1]):
                    best, level, remaining = c, lv, r
        cap = best[3]
        rate = best[4]
        full = (cap - level) / rate if rate > 0 and level < cap else 0.0
        out += ((names[0], best[2]), (names[1], b"%d" % remaining),
                (names[2], _SHORT[math.ceil(full)] if full < 999.0 else _reset(full)))
    return out


def rate_headers(items: tuple[Item, ...], levels: tuple[float, ...]) -> list[Header]:
    """The ``x-ratelimit-*`` headers of the tightest requests and tokens buckets."""
    tightest: dict[str, tuple[int, int, Item, float]] = {}
    for item, level in zip(items, levels, strict=False):
        if item.kind == "parallel":
            continue
        remaining = max(0, int(level))
        best = tightest.get(item.kind)
        if best is None or (remaining, item.limit) < (best[0], best[1]):
            tightest[item.kind] = (remaining, item.limit, item, level)
    out: list[Header] = []
    for kind, (remaining, limit, item, level) in tightest.items():
        names = _NAMES[kind]
        out += [(names[0], str(limit).encode()), (names[1], str(remaining).encode()),
                (names[2], openai_duration(full_in_ms(level, item.capacity, item.rate)).encode())]
    return out


def _retry_headers(ms: float) -> dict[str, str]:
    ms = min(MAX_RETRY_AFTER_S * 1000.0, max(1.0, ms))
    return {"retry-after": str(max(1, math.ceil(ms / 1000))), "retry-after-ms": str(math.ceil(ms))}


def refusal(plan: Plan, costs: tuple[int, ...], outcome: Outcome) -> RateLimited:
    item = plan.items[outcome.failed]
    level = outcome.levels[outcome.failed]
    cost = costs[outcome.failed]
    headers = {k.decode(): v.decode() for k, v in rate_headers(plan.items, outcome.levels)}
    if item.kind == "parallel":
        used = item.capacity - int(level)
        headers |= _retry_headers(1000)
        return RateLimited(
            f"Rate limit reached for concurrent requests (max_parallel) on {item.scope}: Limit {item.limit}, "
            f"Used {used}, Requested 1. Please try again when a request in flight has ended.",
            type="requests", headers=headers)
    wait = wait_ms(level, cost, item.rate)
    headers |= _retry_headers(wait)
    return RateLimited(
        f"Rate limit reached for {item.kind} ({_UNIT[item.kind]}) on {item.scope}: Limit {item.limit}, "
        f"Used {item.capacity - max(0, int(level))}, Requested {cost}. "
        f"Please try again in {openai_duration(wait)}.",
        type=item.kind, headers=headers)


def too_large(plan: Plan, estimate: int) -> RateLimited | None:
    """A request whose estimate exceeds a tokens bucket's size can never fit: no retry will help."""
    if plan.token_capacity is None or estimate <= plan.token_capacity:
        return None
    item = min((i for i in plan.items if i.kind == "tokens"), key=lambda i: i.capacity)
    return RateLimited(
        f"Request too large for tokens (tpm) on {item.scope}: Limit {item.capacity}, Requested {estimate}. "
        f"The estimate is the prompt size plus max_tokens (or max_completion_tokens / max_output_tokens); "
        f"lower them to fit.", type="tokens", headers={"x-should-retry": "false"})


class Ticket:
    """An admitted request: what to give back after it, and its ``x-ratelimit-*`` headers."""

    __slots__ = ("estimate", "give", "hold", "levels", "live", "plan")

    def __init__(self, plan: Plan, hold: str | int, estimate: int, levels: tuple[float, ...] | None,
                 live: bool, give: Give | None = None) -> None:
        self.plan = plan
        self.hold = hold  # the request's slot in the gates: a str in Redis, an int in memory
        self.estimate = estimate
        self.levels = levels  # None: admitted without the limiter (fail_open), no headers
        self.live = live  # False: nothing to give back
        self.give = give  # in memory: the plan's compiled give-back

    @property
    def headers(self) -> list[Header]:
        """OpenAI's headers, computed when asked for (once, when the response starts)."""
        return [] if self.levels is None else plan_headers(self.plan, self.levels)


RefusedHook = Callable[[str, str, str], None]  # key, model, kind


def _noop_refused(_key: str, _model: str, _kind: str) -> None:
    return None


class RateLimits:
    def __init__(self, spec: RateLimitsSpec, limiter: RateLimiter, *, hold_ms: int, shared: bool,
                 on_refused: RefusedHook = _noop_refused, on_failure: Callable[[], None] | None = None) -> None:
        self.spec = spec
        self.limiter = limiter
        self.hold_ms = hold_ms
        self.shared = shared  # a remote store: bounded by redis_timeout_ms, subject to the fail policy
        self.timeout_s = spec.redis_timeout_ms / 1000.0
        self.on_refused = on_refused
        self.on_failure = on_failure
        self._plans: dict[tuple[str, str], tuple[object, object, object, Plan | None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._last_failure_log = -_FAILURE_LOG_INTERVAL_S
        # Fast paths: a local limiter is called without a coroutine, a Redis one gives back without a task
        self._local = limiter if isinstance(limiter, MemoryLimiter) and not shared else None
        self._redis = limiter if isinstance(limiter, RedisLimiter) else None
        self._bounded = False  # the limiter enforces redis_timeout_ms itself (cheaper than asyncio.timeout)
        if self._redis is not None and self._redis.lean is not None:
            self._redis.lean.timeout_s = self.timeout_s
            self._bounded = self._redis.bounded
        self._sent = 0  # gives-back sent without a task and not answered yet
        self._idle: asyncio.Future[None] | None = None
        # Holds: unique per process (random prefix) and per request (a counter); no syscall per request
        self._hold_prefix = os.urandom(6).hex()
        self._hold_n = itertools.count(1)

    def plan(self, caller: Limited, entry: ModelEntry) -> Plan | None:
        """The plan for this key and model (cached; rebuilt when the key's or model's limits change)."""
        key_model = caller.per_model.get(entry.id) if caller.per_model else None
        cached = self._plans.get((caller.name, entry.id))
        if cached is not None and cached[0] is caller.limits and cached[1] is key_model and cached[2] is entry.limits:
            return cached[3]
        plan = build_plan(caller.name, entry.id, caller.limits, key_model, entry.limits)
        self._plans[(caller.name, entry.id)] = (caller.limits, key_model, entry.limits, plan)
        return plan

    def _failed(self, exc: BaseException) -> None:
        if self.on_failure is not None:
            self.on_failure()
        now = time.monotonic()
        if now - self._last_failure_log >= _FAILURE_LOG_INTERVAL_S:
            self._last_failure_log = now
            log.warning("rate limiter unavailable (%s); policy %s", exc or type(exc).__name__,
                        self.spec.redis_failure)

    def _hold(self) -> str:
        return f"{self._hold_prefix}{next(self._hold_n):x}"

    async def admit(self, plan: Plan, estimate: int) -> Ticket:
        """Take from every bucket, or raise RateLimited (429) / LimiterUnavailable (503, fail_closed)."""
        cap = plan.token_capacity
        if cap is not None and estimate > cap:
            big = too_large(plan, estimate)
            assert big is not None
            self.on_refused(plan.key_name, plan.model, "tokens")
            raise big
        local = self._local
        if local is not None:  # in memory: the plan's compiled program, an int for the hold, no coroutine
            hold_n = next(self._hold_n)
            program = local.program(plan.items)
            outcome = program.take(estimate, hold_n, self.hold_ms)
            if outcome.ok:
                return Ticket(plan, hold_n, estimate, outcome.levels, True, program.give)
            self._refuse(plan, estimate, outcome)
        hold = self._hold()
        costs = plan.costs(estimate)
        try:
            if self.shared and not self._bounded:
                async with asyncio.timeout(self.timeout_s):
                    outcome = await self.limiter.acquire(plan.items, costs, hold, self.hold_ms)
            else:
                outcome = await self.limiter.acquire(plan.items, costs, hold, self.hold_ms)
        except (LimiterFailure, TimeoutError, OSError) as exc:
            self._failed(exc)
            if self.spec.redis_failure == "fail_closed":
                raise LimiterUnavailable(
                    "The rate limiter is unavailable (its Redis did not answer in time), and this gateway "
                    "refuses requests it cannot count (rate_limits.redis_failure: fail_closed). "
                    "Please try again shortly.") from None
            return Ticket(plan, hold, estimate, None, False)
        if not outcome.ok:
            self._refuse(plan, estimate, outcome)
        return Ticket(plan, hold, estimate, outcome.levels, True)

    def _refuse(self, plan: Plan, estimate: int, outcome: Outcome) -> NoReturn:
        err = refusal(plan, plan.costs(estimate), outcome)
        self.on_refused(plan.key_name, plan.model, plan.items[outcome.failed].kind)
        raise err

    def settle(self, ticket: Ticket, actual_tokens: int | None) -> None:
        """Free the in-flight slots and reconcile tokens (None: usage unknown, the estimate stands)."""
        if not ticket.live:
            return
        plan = ticket.plan
        delta = 0 if actual_tokens is None else ticket.estimate - actual_tokens
        if not plan.has_gates and not delta:
            return
        if ticket.give is not None:
            ticket.give(delta, ticket.hold)
            return
        refunds = plan.refunds(delta)
        hold = ticket.hold
        assert isinstance(hold, str)  # memory (int holds) returned above
        if self._redis is not None and self._redis.release_nowait(plan.items, refunds, hold, self._answered):
            self._sent += 1
            return
        task = asyncio.get_running_loop().create_task(self._release(ticket, refunds))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _answered(self, error: BaseException | None) -> None:
        self._sent -= 1
        if error is not None:
            self._failed(error)
        if not self._sent and self._idle is not None and not self._idle.done():
            self._idle.set_result(None)

    async def _release(self, ticket: Ticket, refunds: tuple[int, ...]) -> None:
        assert isinstance(ticket.hold, str)
        try:
            async with asyncio.timeout(max(1.0, self.timeout_s * 10)):
                await self.limiter.release(ticket.plan.items, refunds, ticket.hold)
        except (LimiterFailure, TimeoutError, OSError) as exc:
            self._failed(exc)

    @property
    def pending(self) -> int:
        """Give-backs still in flight."""
        return len(self._tasks) + self._sent

    async def drain(self) -> None:
        """Wait for the give-backs still in flight (at shutdown, and in tests)."""
        while self._tasks or self._sent:
            if self._sent:
                self._idle = asyncio.get_running_loop().create_future()
                await self._idle
            if self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def aclose(self) -> None:
        try:
            async with asyncio.timeout(5):
                await self.drain()
        except TimeoutError:
            pass
        await self.limiter.aclose()
