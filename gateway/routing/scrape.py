"""Background scrape of each backend's vLLM ``/metrics`` into the :class:`~gateway.routing.load.LoadBoard`.

One asyncio task per upstream (a slow backend never delays the others' data), every
``routing.metrics_interval_s``, with the upstream's key as ``Bearer`` (vLLM itself does not ask for it
on ``/metrics``; a proxy in front of it may). Only upstreams of models on ``load_aware`` or with ``shed``
are scraped (:func:`scrape_targets`). Never on the request path.

The exposition is ~55 KB and ~700 lines; :func:`parse_vllm_metrics` only looks for the three gauge
families it needs (``bytes.find``), it does not parse the rest.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Iterable

import httpx

from gateway.config.schema import RoutingSpec, UpstreamSpec
from gateway.domain import ModelEntry
from gateway.routing.load import LoadBoard, Scrape

log = logging.getLogger("gateway.routing")

RUNNING = b"vllm:num_requests_running"
WAITING = b"vllm:num_requests_waiting"
KV_USAGE = b"vllm:kv_cache_usage_perc"
MAX_BODY = 4 << 20  # a /metrics bigger than this is not vLLM's


class MetricsFormatError(ValueError):
    pass


def _samples(text: bytes, name: bytes) -> list[float]:
    """Values of every sample of the family ``name`` (any labels), exact name only: a longer name
    (``vllm:num_requests_waiting_by_reason``) does not match."""
    out: list[float] = []
    pos = 0
    while True:
        i = text.find(name, pos)
        if i < 0:
            return out
        pos = i + len(name)
        if i > 0 and text[i - 1] != 0x0A:  # not at a line start (a comment, or inside another name)
            continue
        nxt = text[pos:pos + 1]
        end = text.find(b"\n", pos)
        if end < 0:
            end = len(text)
        if nxt == b"{":
            close = text.rfind(b"}", pos, end)  # label values may hold '}' but the set ends the last one
            if close < 0:
                raise MetricsFormatError(f"unterminated labels after {name.decode()}")
            rest_at = close + 1
        elif nxt == b" ":
            rest_at = pos
        else:
            continue
        fields = text[rest_at:end].split()
        if not fields:
            raise MetricsFormatError(f"no value for {name.decode()}")
        try:
            value = float(fields[0])
        except ValueError:
            raise MetricsFormatError(f"bad value {fields[0]!r} for {name.decode()}") from None
        if math.isnan(value) or value < 0:
            raise MetricsFormatError(f"bad value {fields[0]!r} for {name.decode()}")
        out.append(value)


def parse_vllm_metrics(text: bytes, at: float) -> Scrape:
    """The load gauges of one vLLM ``/metrics`` body: running and waiting summed over engines (data
    parallel exports one sample per ``engine``), KV-cache usage averaged. Missing families: an error."""
    running = _samples(text, RUNNING)
    waiting = _samples(text, WAITING)
    kv = _samples(text, KV_USAGE)
    missing = [n.decode() for n, v in ((RUNNING, running), (WAITING, waiting), (KV_USAGE, kv)) if not v]
    if missing:
        raise MetricsFormatError(f"no {', '.join(missing)} in /metrics (is this a vLLM server?)")
    return Scrape(running=sum(running), waiting=sum(waiting), kv_usage=sum(kv) / len(kv), at=at)


def scrape_targets(entries: Iterable[ModelEntry]) -> list[UpstreamSpec]:
    """The upstreams whose load matters: those of models on ``load_aware`` or with ``shed``; only vLLM
    ones (a ``kind: openai`` upstream has no vLLM /metrics: it ranks as saturated, so it is used last)."""
    return [u.spec for e in entries if e.routing == "load_aware" or e.shed is not None
            for u in e.upstreams if u.spec.kind == "vllm"]


class MetricsScraper:
    """Scrapes a set of upstreams; :meth:`set_upstreams` / :meth:`add` / :meth:`remove` change the set
    while it runs (a changed URL or key restarts that upstream's task). Adding also adds the name to the
    LoadBoard; removing only clears its scraped data (the LoadBoard's own ``set_upstreams`` follows
    the model table, scraped or not)."""

    def __init__(self, load: LoadBoard, spec: RoutingSpec, upstreams: Iterable[UpstreamSpec] = (),
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        """``transport``: what the requests go through (the composition root passes the gateway's lean
        keep-alive transport; default httpx's own). Proxies are not used, as for health probes."""
        self.load = load
        self.spec = spec
        self._transport_arg = transport
        self._transport: httpx.AsyncBaseTransport | None = None
        # A slower answer is no worse than a stale one: wait up to metrics_stale_s (a busy vLLM's API
        # process can be slow to render /metrics; the previous scrape keeps counting meanwhile).
        self.timeout = spec.metrics_stale_s
        self._timeouts = httpx.Timeout(self.timeout).as_dict()
        self._specs: dict[str, UpstreamSpec] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._running = False
        self.add(upstreams)

    @property
    def upstreams(self) -> list[UpstreamSpec]:
        return list(self._specs.values())

    def add(self, upstreams: Iterable[UpstreamSpec]) -> None:
        for u in upstreams:
            assert u.name is not None
            old = self._specs.get(u.name)
            if old is not None and old == u:
                continue
            if old is not None:
                self._cancel(u.name)
            self._specs[u.name] = u
            self.load.add([u.name])
            if self._running:
                self._spawn(u)

    def remove(self, names: Iterable[str]) -> None:
        gone = [n for n in names if n in self._specs]
        for n in gone:
            del self._specs[n]
            self._cancel(n)
        self.load.clear_scrapes(gone)  # membership (in-flight counts) is the LoadBoard's own business

    def set_upstreams(self, upstreams: Iterable[UpstreamSpec]) -> None:
        ups = list(upstreams)
        keep = {u.name for u in ups}
        self.remove([n for n in self._specs if n not in keep])
        self.add(ups)

    async def scrape_one(self, u: UpstreamSpec) -> None:
        assert u.name is not None and self._transport is not None
        headers = [(b"accept", b"text/plain"),
                   (b"accept-encoding", b"identity")]
        key = u.api_key_value()
        if key:
            headers.append((b"authorization", b"Bearer " + key.encode()))
        request = httpx.Request("GET", f"{u.url}/metrics", headers=headers,
                                extensions={"timeout": self._timeouts})
        try:
            async with asyncio.timeout(self.timeout):
                r = await self._transport.handle_async_request(request)
                try:
                    if r.status_code != 200:
                        raise MetricsFormatError(f"answered {r.status_code}")
                    parts = []
                    size = 0
                    async for chunk in r.aiter_raw():
                        size += len(chunk)
                        if size > MAX_BODY:
                            raise MetricsFormatError(f"over {MAX_BODY} bytes")
                        parts.append(chunk)
                finally:
                    await r.aclose()
            scrape = parse_vllm_metrics(b"".join(parts), time.monotonic())
        except (httpx.HTTPError, MetricsFormatError, TimeoutError) as exc:
            what = (f"no answer within {self.timeout:g}s" if isinstance(exc, TimeoutError)
                    else f"{type(exc).__name__}: {exc}" if isinstance(exc, httpx.HTTPError) else str(exc))
            detail = f"{u.url}/metrics: {what}"
            if self.load.failing(u.name) is None:
                log.warning("load metrics of upstream %s failing (counts as saturated): %s", u.name, detail,
                            extra={"upstream": u.name})
            self.load.record_failure(u.name, detail)
            return
        if self.load.failing(u.name) is not None:
            log.info("load metrics of upstream %s back", u.name, extra={"upstream": u.name})
        self.load.record(u.name, scrape)

    async def _loop(self, u: UpstreamSpec, wait_first: bool) -> None:
        if wait_first:
            await asyncio.sleep(self.spec.metrics_interval_s)
        while True:
            try:
                await self.scrape_one(u)
            except Exception:  # a bug here must not stop scraping
                log.exception("metrics scrape of upstream %s failed", u.name)
            await asyncio.sleep(self.spec.metrics_interval_s)

    def _spawn(self, u: UpstreamSpec, wait_first: bool = False) -> None:
        assert u.name is not None
        self._tasks[u.name] = asyncio.create_task(self._loop(u, wait_first), name=f"gateway-scrape-{u.name}")

    def _cancel(self, name: str) -> None:
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()

    async def start(self) -> None:
        """Scrape everything once (so routing starts informed), then keep scraping in the background."""
        if self._running:
            return
        self._transport = self._transport_arg or httpx.AsyncHTTPTransport()
        self._running = True
        if self._specs:
            await asyncio.gather(*(self.scrape_one(u) for u in self._specs.values()))
        for u in self._specs.values():
            self._spawn(u, wait_first=True)

    async def stop(self) -> None:
        self._running = False
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for t in tasks:
            t.cancel()
        for t in tasks:
            try:
                await t
            except asyncio.CancelledError:
                pass
        if self._transport is not None:
            await self._transport.aclose()
            self._transport = None


__all__ = ["MetricsFormatError", "MetricsScraper", "parse_vllm_metrics", "scrape_targets"]
