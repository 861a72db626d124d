"""What this instance knows about each upstream's load: its own requests in flight there, and the last
scrape of the backend's vLLM ``/metrics`` (fed by :mod:`gateway.routing.scrape`).

The selector reads it on every request (no I/O: plain dict look-ups). Upstreams come and go at run
time (admin edits swap the model table): :meth:`LoadBoard.add` / :meth:`LoadBoard.remove` /
:meth:`LoadBoard.set_upstreams`; a name never added is still counted (it appears on first use).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gateway.config.schema import ShedSpec

SATURATED = math.inf
WAITING_WEIGHT = 2.0  # a queued request costs more than a running one: it cannot even start
KV_WEIGHT = 8.0  # a full KV cache (1.0) weighs like 8 running requests: vLLM starts preempting


@dataclass(frozen=True, slots=True)
class Scrape:
    """vLLM's own gauges at one moment (sums over its engines; KV usage is the mean, a 0..1 fraction)."""

    running: float
    waiting: float
    kv_usage: float
    at: float  # time.monotonic() when it was taken


@dataclass(slots=True)
class _State:
    in_flight: int = 0  # this instance's requests being served by the upstream
    since_scrape: int = 0  # of those, the ones that started after the last scrape (not in its numbers)
    epoch: int = 0  # bumped by every scrape (successful or not)
    scrape: Scrape | None = None
    failing: str | None = None  # why the last scrape failed; None when it succeeded or none ran yet


class Lease:
    """One attempt in flight on an upstream; :meth:`release` once when its response ends (idempotent)."""

    __slots__ = ("_board", "_epoch", "name")

    def __init__(self, board: LoadBoard, name: str, epoch: int) -> None:
        self._board: LoadBoard | None = board
        self.name = name
        self._epoch = epoch

    def release(self) -> None:
        board, self._board = self._board, None
        if board is not None:
            board._end(self.name, self._epoch)


InFlightListener = Callable[[str, int], None]
ScrapeListener = Callable[[str, Scrape | None], None]


class LoadBoard:
    def __init__(self, stale_s: float = 3.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.stale_s = stale_s
        self.clock = clock
        self._states: dict[str, _State] = {}
        self.in_flight_listeners: list[InFlightListener] = []
        self.scrape_listeners: list[ScrapeListener] = []

    # ------------------------------------------------------------------ membership
    def add(self, names: Iterable[str]) -> None:
        for n in names:
            self._states.setdefault(n, _State())

    def remove(self, names: Iterable[str]) -> None:
        """Forget these upstreams; leases still open on them are released harmlessly."""
        for n in names:
            self._states.pop(n, None)

    def set_upstreams(self, names: Iterable[str]) -> None:
        keep = set(names)
        self.remove([n for n in self._states if n not in keep])
        self.add(keep)

    def names(self) -> list[str]:
        return list(self._states)

    def _state(self, name: str) -> _State:
        st = self._states.get(name)
        if st is None:
            st = self._states[name] = _State()
        return st

    # ------------------------------------------------------------------ in flight
    def start(self, name: str) -> Lease:
        st = self._state(name)
        st.in_flight += 1
        st.since_scrape += 1
        for fn in self.in_flight_listeners:
            fn(name, st.in_flight)
        return Lease(self, name, st.epoch)

    def _end(self, name: str, epoch: int) -> None:
        st = self._states.get(name)
        if st is None:  # removed meanwhile
            return
        st.in_flight = max(0, st.in_flight - 1)
        if epoch == st.epoch:  # started after the last scrape: no longer adds to it
            st.since_scrape = max(0, st.since_scrape - 1)
        for fn in self.in_flight_listeners:
            fn(name, st.in_flight)

    def in_flight(self, name: str) -> int:
        st = self._states.get(name)
        return 0 if st is None else st.in_flight

    # ------------------------------------------------------------------ scrapes
    def record(self, name: str, scrape: Scrape) -> None:
        st = self._states.get(name)
        if st is None:  # removed while its scrape was on the way
            return
        st.scrape = scrape
        st.failing = None
        st.epoch += 1
        st.since_scrape = 0
        for fn in self.scrape_listeners:
            fn(name, scrape)

    def clear_scrapes(self, names: Iterable[str]) -> None:
        """No longer scraped (its model left load_aware/shed): forget its data, keep its in-flight count."""
        for n in names:
            st = self._states.get(n)
            if st is not None:
                st.scrape = None
                st.failing = None
                st.since_scrape = 0
                st.epoch += 1

    def record_failure(self, name: str, detail: str) -> None:
        st = self._states.get(name)
        if st is None:
            return
        st.failing = detail
        for fn in self.scrape_listeners:
            fn(name, None)

    def scrape(self, name: str) -> Scrape | None:
        st = self._states.get(name)
        return None if st is None else st.scrape

    def failing(self, name: str) -> str | None:
        st = self._states.get(name)
        return None if st is None else st.failing

    def fresh(self, name: str, now: float | None = None) -> Scrape | None:
        """The last scrape if it is recent and the latest attempt succeeded; else None."""
        st = self._states.get(name)
        if st is None or st.scrape is None or st.failing is not None:
            return None
        if (self.clock() if now is None else now) - st.scrape.at > self.stale_s:
            return None
        return st.scrape

    def score(self, name: str, now: float | None = None) -> float:
        """Lower is lighter: running + 2 x waiting + 8 x KV usage from the last scrape, plus this
        instance's requests started since; :data:`SATURATED` without fresh data."""
        s = self.fresh(name, now)
        if s is None:
            return SATURATED
        return s.running + WAITING_WEIGHT * s.waiting + KV_WEIGHT * s.kv_usage + self._states[name].since_scrape

    def ranking(self, names: list[str]) -> list[tuple[float, int]]:
        """``(score, in flight)`` for each name, as :meth:`score` and :meth:`in_flight` say, in one pass
        (the selector's hot path for load_aware)."""
        now = self.clock()
        stale = self.stale_s
        states = self._states
        out: list[tuple[float, int]] = []
        for n in names:
            st = states.get(n)
            if st is None:
                out.append((SATURATED, 0))
                continue
            s = st.scrape
            if s is None or st.failing is not None or now - s.at > stale:
                out.append((SATURATED, st.in_flight))
            else:
                out.append((s.running + WAITING_WEIGHT * s.waiting + KV_WEIGHT * s.kv_usage + st.since_scrape,
                            st.in_flight))
        return out

    def over(self, name: str, shed: ShedSpec) -> bool:
        """Over the shed thresholds: its queue or KV cache reached them, or its metrics are stale or
        failing (saturated). A backend never scraped yet is not over (nothing is known against it)."""
        st = self._states.get(name)
        if st is None or (st.scrape is None and st.failing is None):
            return False
        s = self.fresh(name)
        if s is None:
            return True
        if shed.max_waiting is not None and s.waiting >= shed.max_waiting:
            return True
        return shed.max_kv_usage is not None and s.kv_usage >= shed.max_kv_usage


__all__ = ["SATURATED", "Lease", "LoadBoard", "Scrape"]
