"""What the gateway currently knows about each upstream's health.

A background task probes every upstream (see :mod:`gateway.routing.probe`) each at its own pace
(``probe: passive`` upstreams never); the forwarder also reports passive failures (connection
refused) so routing reacts before the next probe. With a :class:`~gateway.routing.breaker.BreakerBoard`
attached, :meth:`HealthBoard.usable` also says no while an upstream's circuit is open, and a
successful probe closes its circuit: the selector needs to know nothing about breakers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

import httpx

from gateway.config.schema import DEFAULT_OPENAI_PROBE_INTERVAL_S, HealthSpec, UpstreamSpec
from gateway.routing.breaker import BreakerBoard
from gateway.routing.probe import ProbeResult, ProbeState, probe_upstream

log = logging.getLogger("gateway.health")

_LOUD = {ProbeState.KEY_MISMATCH, ProbeState.MODEL_MISSING}


class HealthBoard:
    def __init__(self, names: Iterable[str], breakers: BreakerBoard | None = None) -> None:
        self.breakers = breakers
        self._states: dict[str, ProbeResult] = {
            n: ProbeResult(ProbeState.UNKNOWN, "not probed yet") for n in names
        }
        self._changed_at: dict[str, float] = {}
        self._probed_at: dict[str, float] = {}
        self._max_model_len: dict[str, int] = {}  # last known, kept while a backend is down
        self.listeners: list[Callable[[str, ProbeResult], None]] = []

    def get(self, name: str) -> ProbeResult:
        return self._states.get(name, ProbeResult(ProbeState.UNKNOWN, "not probed yet"))

    def usable(self, name: str) -> bool:
        """OK, or not probed yet (optimistic: a request may still succeed), and its circuit not open."""
        if self.get(name).state not in (ProbeState.OK, ProbeState.UNKNOWN):
            return False
        return self.breakers is None or self.breakers.available(name)

    def add(self, name: str) -> None:
        """A new upstream (admin edit): unknown until probed."""
        self._states[name] = ProbeResult(ProbeState.UNKNOWN, "not probed yet")

    def forget(self, name: str) -> None:
        """An upstream left the mapping: its state goes with it."""
        for d in (self._states, self._changed_at, self._probed_at, self._max_model_len):
            d.pop(name, None)

    def last_probe(self, name: str) -> float | None:
        """Unix time of the last probe result (or passive failure) recorded for ``name``."""
        return self._probed_at.get(name)

    def set(self, name: str, result: ProbeResult) -> None:
        previous = self._states.get(name)
        self._states[name] = result
        self._probed_at[name] = time.time()
        if result.max_model_len is not None:
            self._max_model_len[name] = result.max_model_len
        if previous is None or previous.state != result.state:
            self._changed_at[name] = time.time()
            level = logging.ERROR if result.state in _LOUD else (
                logging.INFO if result.ok else logging.WARNING)
            log.log(level, "upstream %s is %s: %s", name, result.state.value, result.detail,
                    extra={"upstream": name, "state": result.state.value})
        if result.ok and self.breakers is not None:
            self.breakers.probe_ok(name)
        for listener in self.listeners:
            listener(name, result)

    def max_model_len(self, name: str) -> int | None:
        """The backend's context length from its last model card, if it was ever probed successfully."""
        return self._max_model_len.get(name)

    def mark_down(self, name: str, detail: str) -> None:
        self.set(name, ProbeResult(ProbeState.DOWN, detail))


class HealthMonitor:
    """Probes all upstreams now and then every ``spec.interval_s`` seconds."""

    def __init__(self, board: HealthBoard, upstreams: list[UpstreamSpec], spec: HealthSpec) -> None:
        self.board = board
        self.upstreams = upstreams
        self.spec = spec
        self._client = httpx.AsyncClient(trust_env=False, timeout=spec.timeout_s)
        self._task: asyncio.Task[None] | None = None
        self._once: set[asyncio.Task[None]] = set()

    def set_upstreams(self, upstreams: list[UpstreamSpec], probe: list[UpstreamSpec] | None = None) -> None:
        """The mapping changed: probe these from now on, and ``probe`` (new ones) at once."""
        self.upstreams = list(upstreams)
        probe = [u for u in probe or () if u.probe_mode != "passive"]
        if probe and self._task is not None:
            task = asyncio.get_running_loop().create_task(self.probe_all(probe))
            self._once.add(task)
            task.add_done_callback(self._once.discard)

    def interval(self, u: UpstreamSpec) -> float:
        if u.probe_interval_s is not None:
            return u.probe_interval_s
        return DEFAULT_OPENAI_PROBE_INTERVAL_S if u.kind == "openai" else self.spec.interval_s

    def probed(self) -> list[UpstreamSpec]:
        return [u for u in self.upstreams if u.probe_mode != "passive"]

    async def probe_all(self, only: list[UpstreamSpec] | None = None) -> None:
        targets = self.probed() if only is None else list(only)
        results = await asyncio.gather(
            *(probe_upstream(self._client, u, self.spec.timeout_s) for u in targets)
        )
        current = {u.name for u in self.upstreams}
        for u, r in zip(targets, results, strict=True):
            if u.name not in current:  # removed while it was being probed
                continue
            assert u.name is not None
            if r.state is ProbeState.LOCAL_ERROR:  # says nothing about the backend: keep its state
                log.error("health probe of upstream %s skipped: %s", u.name, r.detail,
                          extra={"upstream": u.name, "state": r.state.value})
                continue
            self.board.set(u.name, r)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        due: dict[str | None, float] = {}
        while True:
            now = loop.time()
            probed = self.probed()
            # upstreams added by an admin edit were probed once when added; then on their interval
            due = {u.name: due.get(u.name, now + self.interval(u)) for u in probed}
            # wake at least every second, so an upstream added meanwhile gets its schedule
            await asyncio.sleep(max(0.0, min([now + 1.0, *due.values()]) - now))
            now = loop.time()
            ups = [u for u in self.probed() if due.get(u.name, now + 1.0) <= now]
            for u in ups:
                due[u.name] = now + self.interval(u)
            try:
                await self.probe_all(ups)
            except Exception:  # a probe bug must not stop probing
                log.exception("health probe round failed")

    async def start(self) -> None:
        if not self.spec.enabled:
            return
        await self.probe_all()
        self._task = asyncio.create_task(self._loop(), name="gateway-health")

    async def stop(self) -> None:
        for task in list(self._once):
            task.cancel()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        await self._client.aclose()
