"""Ownership of the httpx clients: one keep-alive pool per upstream.

Each client runs on :class:`~gateway.upstream.transport.LeanTransport` (an O(1) pool and a C
parser) unless the upstream goes through an HTTP proxy, which httpx's own transport handles.

Environment proxies (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY) are ignored (``trust_env=False``): a
stray proxy variable must not send traffic for a local GPU box through a "local proxy". An
upstream that really needs a proxy names it in its ``proxy`` field.
"""

from __future__ import annotations

import httpx

from gateway.config.schema import Timeouts
from gateway.domain import Upstream
from gateway.upstream.transport import LeanTransport

# Below uvicorn's default keep-alive timeout (5 s), so an idle connection is retired by us first.
KEEPALIVE_EXPIRY_S = 4.0


class UpstreamClients:
    def __init__(self, timeouts: Timeouts) -> None:
        self._timeouts = timeouts
        self._clients: dict[str, httpx.AsyncClient] = {}
        self._urls: dict[tuple[str, str], httpx.URL] = {}
        self._lean: dict[str, LeanTransport] = {}
        self._timeout_ext = httpx.Timeout(connect=timeouts.connect, read=None, write=timeouts.idle,
                                          pool=timeouts.connect).as_dict()

    def _make(self, upstream: Upstream) -> httpx.AsyncClient:
        spec = upstream.spec
        t = self._timeouts
        transport = None
        if not spec.proxy:
            transport = self._lean[upstream.name] = LeanTransport(
                max_connections=spec.max_connections, max_idle=spec.max_connections,
                keepalive_expiry=KEEPALIVE_EXPIRY_S)
        return httpx.AsyncClient(
            base_url=upstream.base_url,
            trust_env=False,
            proxy=spec.proxy,
            transport=transport,
            # Reading the headers and each body chunk is bounded by asyncio deadlines in the
            # forwarder (first byte / idle / total); httpx bounds connecting and writing.
            timeout=httpx.Timeout(connect=t.connect, read=None, write=t.idle, pool=t.connect),
            limits=httpx.Limits(
                max_connections=spec.max_connections,
                max_keepalive_connections=spec.max_connections,
                keepalive_expiry=KEEPALIVE_EXPIRY_S,
            ),
            follow_redirects=False,
        )

    async def send(self, upstream: Upstream, request: httpx.Request) -> httpx.Response:
        """Send ``request``; the response's body is left open (the caller reads and closes it).

        On the lean transport the request goes straight to it: the AsyncClient layer would only add
        a cookie jar (which must not carry one user's upstream cookies to another) and its cost.
        """
        transport = self._lean.get(upstream.name)
        if transport is None:
            if upstream.spec.proxy:
                return await self.get(upstream).send(request, stream=True)
            self.get(upstream)
            transport = self._lean[upstream.name]
        request.extensions["timeout"] = self._timeout_ext
        response = await transport.handle_async_request(request)
        response.request = request
        return response

    def get(self, upstream: Upstream) -> httpx.AsyncClient:
        client = self._clients.get(upstream.name)
        if client is None:
            client = self._clients[upstream.name] = self._make(upstream)
        return client

    def url(self, upstream: Upstream, path: str) -> httpx.URL:
        """The upstream's URL for ``path``, parsed once."""
        key = (upstream.name, path)
        url = self._urls.get(key)
        if url is None:
            url = self._urls[key] = httpx.URL(upstream.base_url + path)
        return url

    async def aclose(self) -> None:
        clients, self._clients = self._clients, {}
        self._lean = {}
        for c in clients.values():
            await c.aclose()
