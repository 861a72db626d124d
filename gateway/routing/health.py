"""What the gateway currently knows about each upstream's health.

A background task probes every upstream (see :mod:`gateway.routing.probe`); the forwarder also
reports passive failures (connection refused) so routing reacts before the next probe.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

import httpx

from gateway.config.schema import HealthSpec, UpstreamSpec
from gateway.routing.probe import ProbeResult, ProbeState, probe_upstream

log = logging.getLogger("gateway.health")

_LOUD = {ProbeState.KEY_MISMATCH, ProbeState.MODEL_MISSING}


class HealthBoard:
    def __init__(self, names: Iterable[str]) -> None:
        self._states: dict[str, ProbeResult] = {
            n: ProbeResult(ProbeState.UNKNOWN, "not probed yet") for n in names
        }
        self._changed_at: dict[str, float] = {}
        self.listeners: list[Callable[[str, ProbeResult], None]] = []

    def get(self, name: str) -> ProbeResult:
        return self._states.get(name, ProbeResult(ProbeState.UNKNOWN, "not probed yet"))

    def usable(self, name: str) -> bool:
        """OK, or not probed yet (optimistic: a request may still succeed)."""
        return self.get(name).state in (ProbeState.OK, ProbeState.UNKNOWN)

    def set(self, name: str, result: ProbeResult) -> None:
        previous = self._states.get(name)
        self._states[name] = result
        if previous is None or previous.state != result.state:
            self._changed_at[name] = time.time()
            level = logging.ERROR if result.state in _LOUD else (
                logging.INFO if result.ok else logging.WARNING)
            log.log(level, "upstream %s is %s: %s", name, result.state.value, result.detail,
                    extra={"upstream": name, "state": result.state.value})
        for listener in self.listeners:
            listener(name, result)

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

    async def probe_all(self) -> None:
        results = await asyncio.gather(
            *(probe_upstream(self._client, u, self.spec.timeout_s) for u in self.upstreams)
        )
        for u, r in zip(self.upstreams, results, strict=True):
            assert u.name is not None
            self.board.set(u.name, r)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.spec.interval_s)
            try:
                await self.probe_all()
            except Exception:  # a probe bug must not stop probing
                log.exception("health probe round failed")

    async def start(self) -> None:
        if not self.spec.enabled:
            return
        await self.probe_all()
        self._task = asyncio.create_task(self._loop(), name="gateway-health")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        await self._client.aclose()
