"""Ownership of the httpx clients: one keep-alive pool per upstream.

Environment proxies (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY) are ignored (``trust_env=False``): a
stray proxy variable must not send traffic for a local GPU box through a "local proxy". An
upstream that really needs a proxy names it in its ``proxy`` field.
"""

from __future__ import annotations

import httpx

from gateway.config.schema import Timeouts
from gateway.mappings.snapshot import Upstream


class UpstreamClients:
    def __init__(self, timeouts: Timeouts) -> None:
        self._timeouts = timeouts
        self._clients: dict[str, httpx.AsyncClient] = {}

    def _make(self, upstream: Upstream) -> httpx.AsyncClient:
        spec = upstream.spec
        t = self._timeouts
        return httpx.AsyncClient(
            base_url=upstream.base_url,
            trust_env=False,
            proxy=spec.proxy,
            # Reading the headers and each body chunk is bounded by asyncio deadlines in the
            # forwarder (first byte / idle / total); httpx bounds connecting and writing.
            timeout=httpx.Timeout(connect=t.connect, read=None, write=t.idle, pool=t.connect),
            limits=httpx.Limits(
                max_connections=spec.max_connections,
                max_keepalive_connections=spec.max_connections,
                keepalive_expiry=30.0,
            ),
            follow_redirects=False,
        )

    def get(self, upstream: Upstream) -> httpx.AsyncClient:
        client = self._clients.get(upstream.name)
        if client is None:
            client = self._clients[upstream.name] = self._make(upstream)
        return client

    async def aclose(self) -> None:
        clients, self._clients = self._clients, {}
        for c in clients.values():
            await c.aclose()
