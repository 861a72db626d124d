"""A lean HTTP/1.1 transport for httpx: asyncio protocol + httptools parser + O(1) keep-alive pool.

Why not httpx's default transport: httpcore's pool walks every pooled connection (a ``poll()``
system call each) on every request start and every response close, and h11 parses in pure Python;
under load that was most of the gateway's CPU (see ``loadtest/README.md``). This transport keeps
httpx's API, timeouts and exception types, and does only what talking to a vLLM backend needs:

- one request per connection at a time, HTTP/1.1 keep-alive, ``Content-Length`` request bodies;
- a LIFO list of idle connections per backend: taking and returning one is O(1); connections the
  server closed (uvicorn's 5 s keep-alive timeout) are noticed by the protocol and skipped;
- a request that meets a reused connection closed by the server before any response byte is sent
  once more on a fresh connection (the server never saw it);
- response bodies (Content-Length, chunked or until close) are handed over chunk by chunk as they
  arrive, with back-pressure on the socket;
- closing a response before its end closes the connection (so vLLM aborts the generation).
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import AsyncIterator
from typing import Any, cast

import httptools
import httpx

_MAX_BUFFER = 1 << 20  # pause reading the socket when this much body is waiting for the consumer


class _ServerClosed(Exception):
    """The server closed the connection before sending any byte of the response."""


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.keep_alive = True
        self.headers_done = False
        self.until_close = False
        self.complete = False
        self.got_bytes = False
        self.error: Exception | None = None
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self.paused = False
        self._waiter: asyncio.Future[None] | None = None

    # -- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # asyncio's or uvloop's TCP transport (uvloop's is not an asyncio.Transport subclass)
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"invalid HTTP response from upstream: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.headers_done and self.until_close:
            self.complete = True  # a body without length or chunking ends when the connection does
        if not self.complete and self.error is None:
            if not self.got_bytes:
                self._fail(_ServerClosed())
            else:
                self._fail(httpx.RemoteProtocolError(
                    "upstream closed the connection before the response was complete"))
        self._wake()

    # -- httptools callbacks ----------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        framed = any(k.lower() in (b"content-length", b"transfer-encoding") for k, _ in self.headers)
        self.until_close = not framed and self.status not in (204, 304) and self.status >= 200
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > _MAX_BUFFER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()

    # -- used by the transport ----------------------------------------------------------------
    def _fail(self, exc: Exception) -> None:
        if self.error is None:
            self.error = exc
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def usable(self) -> bool:
        return not self.closed and self.transport is not None and not self.transport.is_closing()

    def send(self, head: bytes, body: bytes) -> None:
        self._reset()
        self.parser = httptools.HttpResponseParser(self)
        assert self.transport is not None
        self.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            self.transport.write(body)

    def _headers_late(self) -> None:
        if not self.headers_done:
            self._fail(TimeoutError())

    async def wait_headers(self, by: float | None = None) -> None:
        """Until the response head is parsed; ``TimeoutError`` at loop time ``by`` (one timer handle,
        no cancellation of the caller's task)."""
        if self.headers_done:
            return
        late = None
        if by is not None:
            late = asyncio.get_running_loop().call_at(by, self._headers_late)
        try:
            while not self.headers_done:
                if self.error is not None:
                    raise self.error
                await self._wait()
        finally:
            if late is not None:
                late.cancel()

    async def next_chunk(self) -> bytes | None:
        while True:
            if self.chunks:
                # Everything that has arrived, at once: under load one read carries many HTTP chunks
                # (SSE events), and one write of all of them costs the client side one send, not one
                # per event. Nothing waits for more: a lone chunk goes out as soon as it is here.
                if len(self.chunks) == 1:
                    chunk = self.chunks.popleft()
                else:
                    chunk = b"".join(self.chunks)
                    self.chunks.clear()
                self.buffered -= len(chunk)
                if self.paused and self.buffered <= _MAX_BUFFER // 2 and self.transport is not None:
                    self.paused = False
                    self.transport.resume_reading()
                return chunk
            if self.complete:
                return None
            if self.error is not None:
                raise self.error
            await self._wait()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class LeanBody(httpx.AsyncByteStream):
    def __init__(self, conn: _Connection, pool: _Pool) -> None:
        self._conn = conn
        self._pool = pool
        self._done = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._conn
        try:
            while (chunk := await conn.next_chunk()) is not None:
                yield chunk
        except _ServerClosed:
            raise httpx.RemoteProtocolError("upstream closed the connection mid-response") from None
        except httpx.RemoteProtocolError:
            raise
        except OSError as exc:
            raise httpx.ReadError(str(exc)) from exc

    def take_complete(self) -> bytes | None:
        """The whole body when all of it has already arrived (a small answer comes in the same read
        as its head), else None (then iterate). Nothing to wait for, so no timer is needed."""
        conn = self._conn
        if not conn.complete or conn.error is not None:
            return None
        chunks = conn.chunks
        body = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        conn.buffered = 0
        return body

    async def aclose(self) -> None:
        if self._done:
            return
        self._done = True
        conn = self._conn
        reusable = conn.complete and conn.keep_alive and not conn.chunks and conn.usable()
        self._pool.release(conn, reusable)


class _RawHeaders:
    """Case-insensitive ``get`` over the raw header list (no ``httpx.Headers`` built per response)."""

    __slots__ = ("_raw",)

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self._raw = raw

    def get(self, key: str, default: Any = None) -> Any:
        name = key.lower().encode("latin-1")
        for k, v in self._raw:
            if k.lower() == name:
                return v.decode("latin-1")
        return default


class LeanResponse:
    """An upstream response on the lean transport: its status, raw headers and body stream
    (:class:`~gateway.upstream.response.UpstreamResponse`)."""

    __slots__ = ("raw_headers", "status_code", "stream")

    def __init__(self, status_code: int, raw_headers: list[tuple[bytes, bytes]], stream: LeanBody) -> None:
        self.status_code = status_code
        self.raw_headers = raw_headers
        self.stream = stream

    @property
    def headers(self) -> _RawHeaders:
        return _RawHeaders(self.raw_headers)

    def aiter_raw(self) -> AsyncIterator[bytes]:
        return self.stream.__aiter__()

    async def aclose(self) -> None:
        await self.stream.aclose()


class _Pool:
    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None, max_connections: int,
                 max_idle: int, keepalive_expiry: float) -> None:
        self.host = host
        self.port = port
        self.tls = tls
        self.idle: list[_Connection] = []
        self.max_idle = max_idle
        self.keepalive_expiry = keepalive_expiry
        self.slots = asyncio.Semaphore(max_connections)
        self.open: set[_Connection] = set()

    async def acquire(self, connect_timeout: float | None, pool_timeout: float | None) -> tuple[_Connection, bool]:
        if self.slots.locked():  # every connection busy: wait, at most pool_timeout
            try:
                async with asyncio.timeout(pool_timeout):
                    await self.slots.acquire()
            except TimeoutError:
                raise httpx.PoolTimeout("no free connection to the upstream in time") from None
        else:
            await self.slots.acquire()  # returns at once (no timer armed for nothing)
        try:
            now = time.monotonic()
            while self.idle:
                conn = self.idle.pop()
                if conn.usable() and now - conn.idle_since < self.keepalive_expiry:
                    return conn, True
                self._drop(conn)
            return await self._connect(connect_timeout), False
        except BaseException:
            self.slots.release()
            raise

    async def _connect(self, timeout: float | None) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                _t, conn = await loop.create_connection(
                    _Connection, self.host, self.port, ssl=self.tls,
                    server_hostname=self.host if self.tls else None)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {self.host}:{self.port} timed out") from None
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        self.open.add(conn)
        return conn

    def release(self, conn: _Connection, reusable: bool) -> None:
        self.slots.release()
        if reusable and len(self.idle) < self.max_idle:
            conn.idle_since = time.monotonic()
            self.idle.append(conn)
        else:
            self._drop(conn)

    def discard(self, conn: _Connection) -> None:
        self.slots.release()
        self._drop(conn)

    def _drop(self, conn: _Connection) -> None:
        conn.close()
        self.open.discard(conn)

    def close(self) -> None:
        for conn in list(self.open):
            conn.close()
        self.open.clear()
        self.idle.clear()


class LeanTransport(httpx.AsyncBaseTransport):
    """An httpx transport for one upstream origin (scheme://host:port)."""

    def __init__(self, max_connections: int = 256, max_idle: int = 64, keepalive_expiry: float = 4.0) -> None:
        self._limits = (max_connections, max_idle, keepalive_expiry)
        self._pools: dict[tuple[bytes, bytes, int], _Pool] = {}

    def _pool(self, url: httpx.URL) -> _Pool:
        scheme = url.raw_scheme
        port = url.port or (443 if scheme == b"https" else 80)
        key = (scheme, url.raw_host, port)
        pool = self._pools.get(key)
        if pool is None:
            tls = ssl.create_default_context() if scheme == b"https" else None
            pool = self._pools[key] = _Pool(url.host, port, tls, *self._limits)
        return pool

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout", {})
        # request.content: bytes (the gateway always sends a complete body)
        r = await self.exchange(request.url, _request_head(request), request.content,
                                timeouts.get("connect"), timeouts.get("pool"))
        return httpx.Response(r.status_code, headers=r.raw_headers, stream=r.stream,
                              extensions={"http_version": b"HTTP/1.1"})

    async def exchange(self, url: httpx.URL, head: bytes, body: bytes, connect_timeout: float | None,
                       pool_timeout: float | None, headers_by: float | None = None) -> LeanResponse:
        """Send ``head`` (request line and headers, framing included) and ``body`` to ``url``'s origin;
        return once the response head is here (its body left open). ``headers_by``: the loop time by
        which the head must have arrived, else ``TimeoutError`` (the connection is closed)."""
        pool = self._pool(url)
        for attempt in (1, 2):
            conn, reused = await pool.acquire(connect_timeout, pool_timeout)
            try:
                conn.send(head, body)
                await conn.wait_headers(headers_by)
            except _ServerClosed:
                pool.discard(conn)
                if reused and attempt == 1:
                    continue  # the server had closed this idle connection: it never saw the request
                raise httpx.RemoteProtocolError("upstream closed the connection without a response") from None
            except TimeoutError:  # headers_by passed (an OSError subclass: not a write error)
                pool.discard(conn)
                raise
            except OSError as exc:
                pool.discard(conn)
                raise httpx.WriteError(str(exc)) from exc
            except BaseException:  # errors, timeouts and cancellation: this connection is spoilt
                pool.discard(conn)
                raise
            return LeanResponse(conn.status, conn.headers, LeanBody(conn, pool))
        raise AssertionError("unreachable")

    def busy(self) -> int:
        """Connections carrying a request now (open and not idle in the pool)."""
        return sum(len(p.open) - len(p.idle) for p in self._pools.values())

    async def aclose(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()


def _request_head(request: httpx.Request) -> bytes:
    lines = [request.method.encode() + b" " + request.url.raw_path + b" HTTP/1.1"]
    lines.extend(k + b": " + v for k, v in request.headers.raw)
    return b"\r\n".join(lines) + b"\r\n\r\n"
