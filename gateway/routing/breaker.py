"""Circuit breakers, one per upstream, fed by the passive signals of real traffic.

:class:`Breaker` is a pure state machine (the caller passes the time in): it opens after ``failures``
consecutive failures (connect errors, resets before the first byte, 5xx, first-byte timeouts), stays
open ``cool_down_s`` seconds (no traffic at all), then lets exactly one trial request through
(half-open); that trial's success closes it, its failure opens it again for another cool-down. A
successful health probe closes it from any state.

:class:`BreakerBoard` holds one breaker per upstream name, can gain and lose upstreams at runtime
(``add``/``remove``, for a model table swapped live), and tells its listeners about every state
change with the reason (logs, metrics).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

log = logging.getLogger("gateway.breaker")


class CircuitState(StrEnum):
    CLOSED = "closed"
    HALF_OPEN = "half_open"
    OPEN = "open"


CIRCUIT_GAUGE = {CircuitState.CLOSED: 0, CircuitState.HALF_OPEN: 1, CircuitState.OPEN: 2}


@dataclass(frozen=True, slots=True)
class Transition:
    old: CircuitState
    new: CircuitState
    why: str


class Breaker:
    __slots__ = ("consecutive", "cool_down_s", "failures", "opened_at", "state", "trial_out")

    def __init__(self, failures: int, cool_down_s: float) -> None:
        self.failures = failures
        self.cool_down_s = cool_down_s
        self.state = CircuitState.CLOSED
        self.consecutive = 0
        self.opened_at = 0.0
        self.trial_out = False  # half-open: the one trial request is in flight

    def available(self, now: float) -> bool:
        """Whether :meth:`acquire` would let a request through now (changes nothing)."""
        if self.state is CircuitState.CLOSED:
            return True
        if self.state is CircuitState.OPEN:
            return now - self.opened_at >= self.cool_down_s
        return not self.trial_out

    def acquire(self, now: float) -> tuple[bool, Transition | None]:
        """Take the right to send one request: always when closed; the single trial when the
        cool-down is over (open -> half-open) or when half-open with no trial out."""
        if self.state is CircuitState.CLOSED:
            return True, None
        if self.state is CircuitState.OPEN:
            if now - self.opened_at < self.cool_down_s:
                return False, None
            self.state = CircuitState.HALF_OPEN
            self.trial_out = True
            return True, Transition(CircuitState.OPEN, CircuitState.HALF_OPEN,
                                    f"cool-down of {self.cool_down_s:g}s over: one trial request")
        if self.trial_out:
            return False, None
        self.trial_out = True
        return True, None

    def success(self) -> Transition | None:
        return self._close("trial request succeeded")

    def failure(self, now: float, why: str) -> Transition | None:
        self.consecutive += 1
        if self.state is CircuitState.HALF_OPEN:
            self.trial_out = False
            self.state = CircuitState.OPEN
            self.opened_at = now
            return Transition(CircuitState.HALF_OPEN, CircuitState.OPEN, f"trial request failed: {why}")
        if self.state is CircuitState.CLOSED and self.consecutive >= self.failures:
            self.state = CircuitState.OPEN
            self.opened_at = now
            return Transition(CircuitState.CLOSED, CircuitState.OPEN,
                              f"{self.consecutive} consecutive failures, last: {why}")
        if self.state is CircuitState.OPEN:  # a request that was already in flight when it opened
            self.opened_at = max(self.opened_at, now)
        return None

    def release(self) -> None:
        """The request taken with :meth:`acquire` ended saying nothing about the backend (the client
        left, the backend's 4xx to a bad request, a 429): a half-open trial slot is freed."""
        self.trial_out = False

    def probe_ok(self) -> Transition | None:
        return self._close("health probe succeeded")

    def _close(self, why: str) -> Transition | None:
        self.consecutive = 0
        self.trial_out = False
        if self.state is CircuitState.CLOSED:
            return None
        old, self.state = self.state, CircuitState.CLOSED
        return Transition(old, CircuitState.CLOSED, why)


Listener = Callable[[str, Transition], None]


class BreakerBoard:
    """One :class:`Breaker` per upstream name. Unknown names are treated as closed."""

    def __init__(self, names: Iterable[str], failures: int, cool_down_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.failures = failures
        self.cool_down_s = cool_down_s
        self.clock = clock
        self._breakers: dict[str, Breaker] = {}
        self.listeners: list[Listener] = []
        self.add(names)

    def add(self, names: Iterable[str]) -> None:
        """Start tracking upstreams added at runtime (existing ones keep their state)."""
        for n in names:
            if n not in self._breakers:
                self._breakers[n] = Breaker(self.failures, self.cool_down_s)
                self._emit(n, Transition(CircuitState.CLOSED, CircuitState.CLOSED, "upstream added"), log_it=False)

    def remove(self, names: Iterable[str]) -> None:
        """Forget upstreams removed at runtime."""
        for n in names:
            self._breakers.pop(n, None)

    def names(self) -> list[str]:
        return list(self._breakers)

    def state(self, name: str) -> CircuitState:
        b = self._breakers.get(name)
        return CircuitState.CLOSED if b is None else b.state

    def available(self, name: str) -> bool:
        b = self._breakers.get(name)
        return b is None or b.available(self.clock())

    def open_for(self, name: str) -> float | None:
        """Seconds until an open circuit allows its trial; None when not open."""
        b = self._breakers.get(name)
        if b is None or b.state is not CircuitState.OPEN:
            return None
        return max(0.0, b.opened_at + b.cool_down_s - self.clock())

    def acquire(self, name: str) -> bool:
        b = self._breakers.get(name)
        if b is None:
            return True
        ok, t = b.acquire(self.clock())
        if t is not None:
            self._emit(name, t)
        return ok

    def success(self, name: str) -> None:
        b = self._breakers.get(name)
        if b is not None and (t := b.success()) is not None:
            self._emit(name, t)

    def failure(self, name: str, why: str) -> None:
        b = self._breakers.get(name)
        if b is not None and (t := b.failure(self.clock(), why)) is not None:
            self._emit(name, t)

    def release(self, name: str) -> None:
        b = self._breakers.get(name)
        if b is not None:
            b.release()

    def probe_ok(self, name: str) -> None:
        b = self._breakers.get(name)
        if b is not None and (t := b.probe_ok()) is not None:
            self._emit(name, t)

    def _emit(self, name: str, t: Transition, *, log_it: bool = True) -> None:
        if log_it:
            level = logging.WARNING if t.new is CircuitState.OPEN else logging.INFO
            log.log(level, "upstream %s circuit %s -> %s: %s", name, t.old.value, t.new.value, t.why,
                    extra={"upstream": name, "state": t.new.value})
        for listener in self.listeners:
            listener(name, t)


__all__ = ["CIRCUIT_GAUGE", "Breaker", "BreakerBoard", "CircuitState", "Transition"]
