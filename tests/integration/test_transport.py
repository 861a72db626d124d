"""LeanTransport against scripted HTTP/1.1 servers on 127.0.0.1 (real sockets, real byte framing)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import httpx
import pytest

from gateway.upstream.transport import LeanTransport

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[bool]]


class Server:
    """Serves each request with ``handler(reader, writer, n)``; it returns False to close the connection."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests = 0
        self.open_now = 0
        self.max_open = 0
        self.eofs = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/chat/completions"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        self.open_now += 1
        self.max_open = max(self.max_open, self.open_now)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    self.eofs += 1
                    return
                except asyncio.CancelledError:
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                self.requests += 1
                try:
                    if not await self.handler(reader, writer, self.requests):
                        return
                except asyncio.CancelledError:
                    return
        finally:
            self.open_now -= 1
            writer.close()


def _fixed(body: bytes, extra: bytes = b"") -> Handler:
    async def handler(_r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body)
        await w.drain()
        return b"connection: close" not in extra.lower()

    return handler


async def _post(client: httpx.AsyncClient, url: str) -> httpx.Response:
    r = await client.send(httpx.Request("POST", url, content=b'{"x":1}'), stream=True)
    await r.aread()
    return r


def _client(**kw: int | float) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=LeanTransport(**kw), timeout=httpx.Timeout(5.0))  # type: ignore[arg-type]


def test_keep_alive_reuses_one_connection() -> None:
    async def go() -> None:
        async with Server(_fixed(b'{"ok":true}')) as srv, _client() as c:
            for _ in range(20):
                r = await _post(c, srv.url)
                assert r.status_code == 200 and r.json() == {"ok": True}
                assert r.headers["content-type"] == "application/json"
            assert srv.connections == 1 and srv.requests == 20

    asyncio.run(go())


def test_chunked_and_close_delimited_bodies() -> None:
    async def chunked(_r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for part in (b"data: a\n\n", b"data: [DONE]\n\n"):
            w.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            await w.drain()
        w.write(b"0\r\n\r\n")
        return True

    async def until_close(_r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nraw body until close")
        await w.drain()
        return False

    async def go() -> None:
        async with Server(chunked) as srv, _client() as c:
            for _ in range(3):
                r = await _post(c, srv.url)
                assert r.content == b"data: a\n\ndata: [DONE]\n\n"
            assert srv.connections == 1
        async with Server(until_close) as srv, _client() as c:
            for _ in range(2):
                assert (await _post(c, srv.url)).content == b"raw body until close"
            assert srv.connections == 2

    asyncio.run(go())


def test_server_closing_idle_connections_is_invisible_to_callers() -> None:
    """The server answers, then closes (a keep-alive timeout); the next request needs a new connection."""

    async def answer_then_close(_r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await w.drain()
        return False  # close without saying `connection: close`

    async def go() -> None:
        async with Server(answer_then_close) as srv, _client() as c:
            for _ in range(5):
                assert (await _post(c, srv.url)).content == b"ok"
                await asyncio.sleep(0.01)  # let the close arrive, as it would after 5 s idle
            assert srv.requests == 5 and srv.connections == 5

    asyncio.run(go())


def test_reused_connection_closed_in_flight_is_retried_once() -> None:
    """The close races with our next request: the server never read it, so sending it again is safe."""
    state = {"first": True}

    async def first_answers_then_drops(r: asyncio.StreamReader, w: asyncio.StreamWriter, n: int) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await w.drain()
        if state["first"]:
            state["first"] = False
            try:  # wait for the next request's bytes, then drop it unanswered
                await r.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            w.transport.abort()
            return False
        return True

    async def go() -> None:
        async with Server(first_answers_then_drops) as srv, _client() as c:
            assert (await _post(c, srv.url)).content == b"ok"
            assert (await _post(c, srv.url)).content == b"ok"
            assert srv.connections == 2

    asyncio.run(go())


def test_reset_mid_body_raises_remote_protocol_error() -> None:
    async def reset(_r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
        await w.drain()
        sock = w.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        w.transport.abort()
        return False

    async def go() -> None:
        async with Server(reset) as srv, _client() as c:
            r = await c.send(httpx.Request("POST", srv.url, content=b"{}"), stream=True)
            with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
                await r.aread()
            await r.aclose()

    asyncio.run(go())


def test_closing_a_response_early_closes_the_connection() -> None:
    async def endless(_r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        try:
            for _ in range(1000):
                w.write(b"5\r\nhello\r\n")
                await w.drain()
                await asyncio.sleep(0.01)
        except ConnectionError:
            pass
        return False

    async def go() -> None:
        async with Server(endless) as srv, _client() as c:
            r = await c.send(httpx.Request("POST", srv.url, content=b"{}"), stream=True)
            async for chunk in r.aiter_raw():
                assert chunk.startswith(b"hello")
                break
            await r.aclose()
            for _ in range(200):  # the server notices the close
                if srv.open_now == 0:
                    break
                await asyncio.sleep(0.01)
            assert srv.open_now == 0

    asyncio.run(go())


def test_connection_limit_queues_requests() -> None:
    async def slow(_r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> bool:
        await asyncio.sleep(0.05)
        w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await w.drain()
        return True

    async def go() -> None:
        async with Server(slow) as srv, _client(max_connections=2) as c:
            results = await asyncio.gather(*(_post(c, srv.url) for _ in range(8)))
            assert all(r.content == b"ok" for r in results)
            assert srv.max_open == 2 and srv.requests == 8

    asyncio.run(go())


def test_pool_timeout_connect_errors_and_garbage() -> None:
    async def hang(_r: asyncio.StreamReader, _w: asyncio.StreamWriter, _n: int) -> bool:
        await asyncio.sleep(10)
        return False

    async def garbage(_r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> bool:
        w.write(b"SSH-2.0-OpenSSH_9.0\r\n\r\n")
        await w.drain()
        return False

    async def go() -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            dead_port = s.getsockname()[1]
        async with _client() as c:
            with pytest.raises(httpx.ConnectError):
                await _post(c, f"http://127.0.0.1:{dead_port}/x")
        async with Server(hang) as srv:
            client = httpx.AsyncClient(transport=LeanTransport(max_connections=1),
                                       timeout=httpx.Timeout(5.0, pool=0.2))
            async with client:
                first = asyncio.create_task(_post(client, srv.url))
                await asyncio.sleep(0.05)
                with pytest.raises(httpx.PoolTimeout):
                    await _post(client, srv.url)
                first.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await first
                # the cancelled request gave its slot back
                task = asyncio.create_task(_post(client, srv.url))
                await asyncio.sleep(0.1)
                assert not task.done() and srv.connections == 2
                task.cancel()
        async with Server(garbage) as srv, _client() as c:
            with pytest.raises(httpx.RemoteProtocolError):
                await _post(c, srv.url)

    asyncio.run(go())


def test_chunks_that_arrived_together_are_read_as_one_and_a_lone_chunk_is_not_held() -> None:
    """Many HTTP chunks in one read (a burst of SSE events) come out of the body iterator as one piece,
    so the relay writes them to the client in one send; a chunk that arrives alone comes out alone, at once."""
    release = asyncio.Event()

    async def burst_then_pause(_r: asyncio.StreamReader, w: asyncio.StreamWriter, _n: int) -> bool:
        events = [f"data: {i}\n\n".encode() for i in range(32)]
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                + b"".join(f"{len(e):x}\r\n".encode() + e + b"\r\n" for e in events))  # one write, 32 chunks
        await w.drain()
        await release.wait()
        last = b"data: [DONE]\n\n"
        w.write(f"{len(last):x}\r\n".encode() + last + b"\r\n0\r\n\r\n")
        await w.drain()
        return True

    async def go() -> None:
        async with Server(burst_then_pause) as srv, _client() as c:
            r = await c.send(httpx.Request("POST", srv.url, content=b"{}"), stream=True)
            parts = r.aiter_raw()
            first = await anext(parts)
            while first.count(b"\n\n") < 32:  # the burst may straddle two reads of the socket, never 32
                more = await asyncio.wait_for(anext(parts), 2)
                assert more.count(b"\n\n") > 1
                first += more
            assert first == b"".join(f"data: {i}\n\n".encode() for i in range(32))
            release.set()
            assert await asyncio.wait_for(anext(parts), 2) == b"data: [DONE]\n\n"
            await r.aclose()

    asyncio.run(go())
