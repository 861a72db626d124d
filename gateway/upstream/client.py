"""Ownership of the httpx clients: one keep-alive pool per upstream.

Each client runs on :class:`~gateway.upstream.transport.LeanTransport` (an O(1) pool and a C
parser) unless the upstream goes through an HTTP proxy, which httpx's own transport handles.

Environment proxies (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY) are ignored (``trust_env=False``): a
stray proxy variable must not send traffic for a local GPU box through a "local proxy". An
upstream that really needs a proxy names it in its ``proxy`` field.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

import httpx

from gateway.config.schema import Timeouts
from gateway.domain import Upstream
from gateway.upstream.response import UpstreamResponse
from gateway.upstream.transport import LeanTransport

log = logging.getLogger("gateway.upstream")

PoolKey = tuple[str, str, str | None, int]


def pool_key(upstream: Upstream) -> PoolKey:
    """What a connection pool depends on: an upstream edited in any of these gets a new pool."""
    return (upstream.name, upstream.base_url, upstream.spec.proxy, upstream.spec.max_connections)


@dataclass(frozen=True, slots=True)
class _Target:
    """What every POST to one upstream path shares: the URL, the request line with Host, the limits."""

    url: httpx.URL
    line: bytes
    connect: float | None
    pool: float | None


# Below uvicorn's default keep-alive timeout (5 s), so an idle connection is retired by us first.
KEEPALIVE_EXPIRY_S = 4.0


class UpstreamClients:
    def __init__(self, timeouts: Timeouts) -> None:
        self._timeouts = timeouts
        self._clients: dict[PoolKey, httpx.AsyncClient] = {}
        self._targets: dict[tuple[PoolKey, str], _Target] = {}
        self._lean: dict[PoolKey, LeanTransport] = {}
        self._retiring: set[asyncio.Task[None]] = set()

    def _timeout(self, upstream: Upstream) -> httpx.Timeout:
        """Connect and write limits: the upstream's own ``timeouts`` over the top-level ones."""
        own, t = upstream.spec.timeouts, self._timeouts
        connect = own.connect or t.connect
        return httpx.Timeout(connect=connect, read=None, write=own.idle or t.idle, pool=connect)

    def _make(self, upstream: Upstream) -> httpx.AsyncClient:
        spec = upstream.spec
        transport = None
        if not spec.proxy:
            transport = self._lean[pool_key(upstream)] = LeanTransport(
                max_connections=spec.max_connections, max_idle=spec.max_connections,
                keepalive_expiry=KEEPALIVE_EXPIRY_S)
        return httpx.AsyncClient(
            base_url=upstream.base_url,
            trust_env=False,
            proxy=spec.proxy,
            transport=transport,
            # Reading the headers and each body chunk is bounded by asyncio deadlines in the
            # forwarder (first byte / idle / total); httpx bounds connecting and writing.
            timeout=self._timeout(upstream),
            limits=httpx.Limits(
                max_connections=spec.max_connections,
                max_keepalive_connections=spec.max_connections,
                keepalive_expiry=KEEPALIVE_EXPIRY_S,
            ),
            follow_redirects=False,
        )

    async def post(self, upstream: Upstream, path: str, headers: list[tuple[bytes, bytes]], body: bytes,
                   headers_by: float) -> UpstreamResponse:
        """POST ``body`` to ``upstream``'s ``path`` with ``headers`` (the gateway's; Host and
        Content-Length are added); the response's body is left open (the caller reads and closes it).
        ``TimeoutError`` when the response head has not arrived by loop time ``headers_by``.

        On the lean transport the request goes to it as bytes: no ``httpx.Request`` (its header and URL
        handling was a tenth of a proxied request's CPU) and no AsyncClient layer (which would only add a
        cookie jar, and one user's upstream cookies must never ride along on another user's request).
        """
        key = pool_key(upstream)
        target = self._target(upstream, key, path)
        transport = self._lean.get(key)
        if transport is None:
            if upstream.spec.proxy:
                # A bare Request, not client.build_request(): no URL merging and no cookie jar.
                request = httpx.Request("POST", target.url, content=body, headers=headers)
                async with asyncio.timeout_at(headers_by):
                    return await self.get(upstream).send(request, stream=True)
            self.get(upstream)
            transport = self._lean[key]
        parts = [target.line]
        for k, v in headers:
            parts += (k, b": ", v, b"\r\n")
        parts.append(b"Content-Length: %d\r\n\r\n" % len(body))
        return await transport.exchange(target.url, b"".join(parts), body, target.connect, target.pool,
                                        headers_by)

    def _target(self, upstream: Upstream, key: PoolKey, path: str) -> _Target:
        """The upstream's URL for ``path``, its request line and its limits, made once."""
        target = self._targets.get((key, path))
        if target is None:
            url = httpx.URL(upstream.base_url + path)
            line = b"POST " + url.raw_path + b" HTTP/1.1\r\nHost: " + url.netloc + b"\r\n"  # as httpx writes it
            timeout = self._timeout(upstream)
            target = self._targets[(key, path)] = _Target(url, line, timeout.connect, timeout.pool)
        return target

    def get(self, upstream: Upstream) -> httpx.AsyncClient:
        key = pool_key(upstream)
        client = self._clients.get(key)
        if client is None:
            client = self._clients[key] = self._make(upstream)
        return client

    def retire(self, upstream: Upstream) -> None:
        """An upstream left the mapping (or changed): new requests get a new pool; the old one is closed
        once its last in-flight request is done (at the latest after ``timeouts.total``)."""
        key = pool_key(upstream)
        client = self._clients.pop(key, None)
        lean = self._lean.pop(key, None)
        for k in [k for k in self._targets if k[0] == key]:
            del self._targets[k]
        if client is None:
            return
        task = asyncio.get_running_loop().create_task(self._close_when_idle(upstream.name, client, lean))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _close_when_idle(self, name: str, client: httpx.AsyncClient, lean: LeanTransport | None) -> None:
        deadline = time.monotonic() + self._timeouts.total
        try:
            # polled: the pool has no event for "last connection returned"
            while time.monotonic() < deadline and (lean is None or lean.busy() > 0):  # noqa: ASYNC110
                await asyncio.sleep(0.25 if lean is not None else 5.0)
        finally:
            await client.aclose()
            log.info("connection pool of removed upstream %s closed", name, extra={"upstream": name})

    async def aclose(self) -> None:
        for task in list(self._retiring):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        clients, self._clients = self._clients, {}
        self._lean = {}
        for c in clients.values():
            await c.aclose()
