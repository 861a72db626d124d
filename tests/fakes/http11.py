"""A minimal HTTP/1.1 server connection on asyncio, for fake upstreams in tests.

Hand-written rather than uvicorn so that a test can control every byte and every write: one
`transport.write` per SSE event, a response cut short without the chunked terminator, a TCP
reset, a request that is never answered. `connection_lost` tells a handler at once that its
client went away, which is how the fake notices aborted generations.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from urllib.parse import unquote

MAX_HEAD_BYTES = 64 * 1024


class BadRequest(Exception):
    """The bytes received are not an HTTP/1.1 request this server understands."""


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: str
    headers: tuple[tuple[str, str], ...]  # names lower-cased, in arrival order
    body: bytes
    keep_alive: bool

    def header(self, name: str) -> str | None:
        values = [v for k, v in self.headers if k == name.lower()]
        return ", ".join(values) if values else None


def response_head(status: int, headers: Iterable[tuple[str, str]]) -> bytes:
    """Status line and headers the way uvicorn writes them (`date`, `server` first)."""
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    lines = [f"HTTP/1.1 {status} {phrase}", f"date: {formatdate(usegmt=True)}", "server: uvicorn"]
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def chunk(data: bytes) -> bytes:
    """One chunk of a `transfer-encoding: chunked` body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"


class Connection(asyncio.Protocol):
    """One client connection; `handler(conn)` runs as a task for its whole life."""

    def __init__(
        self,
        handler: Callable[[Connection], Coroutine[None, None, None]],
        tasks: set[asyncio.Task[None]],
        open_conns: set[Connection],
    ) -> None:
        self._handler = handler
        self._tasks = tasks
        self._open = open_conns  # every connection from connection_made to connection_lost
        self._buf = bytearray()
        self._wakeup = asyncio.Event()
        self.closed = asyncio.Event()  # set once the peer is gone (FIN, RST) or we closed it
        self.transport: asyncio.Transport | None = None

    # asyncio.Protocol callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._open.add(self)
        task = asyncio.get_running_loop().create_task(self._handler(self))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def data_received(self, data: bytes) -> None:
        self._buf += data
        self._wakeup.set()

    def eof_received(self) -> bool:
        # A client that half-closes has given up on us (uvicorn treats it as a disconnect too).
        self.closed.set()
        self._wakeup.set()
        return False  # let the transport close itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._open.discard(self)
        self.closed.set()
        self._wakeup.set()

    # reading
    async def _fill(self) -> bool:
        if self.closed.is_set():
            return False
        self._wakeup.clear()
        await self._wakeup.wait()
        return True

    async def _read_until(self, sep: bytes, limit: int) -> bytes | None:
        while (end := self._buf.find(sep)) < 0:
            if len(self._buf) > limit:
                raise BadRequest("request head too large")
            if not await self._fill():
                return None
        data = bytes(self._buf[: end + len(sep)])
        del self._buf[: end + len(sep)]
        return data

    async def _read_exactly(self, size: int) -> bytes | None:
        while len(self._buf) < size:
            if not await self._fill():
                return None
        data = bytes(self._buf[:size])
        del self._buf[:size]
        return data

    async def _read_chunked(self) -> bytes | None:
        body = bytearray()
        while True:
            line = await self._read_until(b"\r\n", MAX_HEAD_BYTES)
            if line is None:
                return None
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError as exc:
                raise BadRequest("bad chunk size") from exc
            if size == 0:
                trailer = await self._read_until(b"\r\n", MAX_HEAD_BYTES)
                while trailer not in (None, b"\r\n"):
                    trailer = await self._read_until(b"\r\n", MAX_HEAD_BYTES)
                return bytes(body)
            data = await self._read_exactly(size + 2)
            if data is None:
                return None
            body += data[:-2]

    async def read_request(self) -> Request | None:
        """The next request, or None when the client closed the connection."""
        head = await self._read_until(b"\r\n\r\n", MAX_HEAD_BYTES)
        if head is None:
            return None
        request_line, *header_lines = head[:-4].decode("latin-1").split("\r\n")
        parts = request_line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise BadRequest(f"bad request line {request_line!r}")
        method, target, version = parts
        headers = []
        for line in header_lines:
            name, sep, value = line.partition(":")
            if not sep:
                raise BadRequest(f"bad header line {line!r}")
            headers.append((name.strip().lower(), value.strip()))
        fields = dict(headers)
        if fields.get("expect", "").lower() == "100-continue":
            self.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if "chunked" in fields.get("transfer-encoding", "").lower():
            body = await self._read_chunked()
        else:
            try:
                length = int(fields.get("content-length", "0"))
            except ValueError as exc:
                raise BadRequest("bad content-length") from exc
            body = await self._read_exactly(length)
        if body is None:
            return None
        connection = fields.get("connection", "").lower()
        keep_alive = "close" not in connection and (version == "HTTP/1.1" or "keep-alive" in connection)
        path, _, query = target.partition("?")
        return Request(method, unquote(path), query, tuple(headers), body, keep_alive)

    # writing and closing
    def write(self, data: bytes) -> bool:
        """Send `data` as one write; False when the client is already gone."""
        if self.closed.is_set() or self.transport is None or self.transport.is_closing():
            return False
        self.transport.write(data)
        return True

    async def client_gone_within(self, seconds: float) -> bool:
        """Wait up to `seconds`; True as soon as the client disconnects."""
        if seconds <= 0:
            await asyncio.sleep(0)  # let a pending connection_lost run
            return self.closed.is_set()
        try:
            await asyncio.wait_for(self.closed.wait(), seconds)
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        """Graceful close (FIN) once buffered data is sent."""
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        """Close now, discarding unsent data (what the kernel does when a server process dies)."""
        if self.transport is not None:
            self.transport.abort()

    def reset(self) -> None:
        """Abortive close: the peer gets a TCP RST (data already sent stays readable on Linux)."""
        if self.transport is None:
            return
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()
