"""A lean pipelined connection to one standalone Redis, for the rate limiter's hot path.

redis-py costs more CPU per command than everything else a limited request does (connection pool,
retry wrapper, per-argument encoding, a socket timeout per read: about 0.3 ms per EVALSHA on one
core). The limiter sends the same few pre-encoded commands over and over, so it gets its own
connection: commands are RESP bytes built by the caller, written together once per event-loop
iteration (one ``send`` for every request that arrived in it), and their replies are matched in
order to waiting futures or callbacks. A caller that stops waiting (a timeout) leaves its slot in
the queue; its reply is read and dropped, so the connection stays usable.

Only what the limiter needs: TCP (``redis://`` URLs; ``rediss://``, unix sockets and clusters go
through redis-py), AUTH and SELECT at connect, RESP2 replies. Errors come back as :class:`RespError`
values (the caller decides: NOSCRIPT means load the script and send again); a lost connection fails
every reply still owed with :class:`ConnectionError`, and the next command connects again.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, cast


class RespError(Exception):
    """An error reply (``-ERR ...``, ``-NOSCRIPT ...``), returned as a value, not raised."""


Reply = Any  # bytes | int | RespError | list[Reply] | None
Waiter = asyncio.Future[Reply] | Callable[[Reply | BaseException], None]


def command(*args: bytes | str | int) -> bytes:
    """RESP encoding of one command (for the rare commands; hot ones are pre-encoded by the caller)."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


class _Incomplete(Exception):
    pass


_INCOMPLETE = _Incomplete()


def _parse(buf: bytes | bytearray, pos: int) -> tuple[Reply, int]:
    """One reply from ``buf`` at ``pos``: (value, position after it); raises _Incomplete."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise _INCOMPLETE
    kind = buf[pos]
    if kind == 36:  # $ bulk string
        n = int(buf[pos + 1:end])
        if n < 0:
            return None, end + 2
        stop = end + 2 + n
        if len(buf) < stop + 2:
            raise _INCOMPLETE
        return bytes(buf[end + 2:stop]), stop + 2
    if kind == 58:  # : integer
        return int(buf[pos + 1:end]), end + 2
    if kind == 42:  # * array
        n = int(buf[pos + 1:end])
        if n < 0:
            return None, end + 2
        pos = end + 2
        items = []
        for _ in range(n):
            item, pos = _parse(buf, pos)
            items.append(item)
        return items, pos
    if kind == 43:  # + simple string
        return bytes(buf[pos + 1:end]), end + 2
    if kind == 45:  # - error
        return RespError(bytes(buf[pos + 1:end]).decode("utf-8", "replace")), end + 2
    raise ValueError(f"unexpected RESP reply type {chr(kind)!r}")


class _Conn(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiters: deque[Waiter] = deque()
        self.buf = bytearray()
        self.out: list[bytes] = []
        self.alive = False
        self.flush_scheduled = False
        self.lost_reason: BaseException | None = None
        self.last_reply = 0.0  # loop time of the last bytes read (or of the connect)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.alive = True
        self.last_reply = asyncio.get_running_loop().time()

    def connection_lost(self, exc: Exception | None) -> None:
        self.alive = False
        self.lost_reason = exc
        err = ConnectionError(f"Redis connection lost ({exc or 'closed by the server'})")
        waiters, self.waiters = self.waiters, deque()
        for w in waiters:
            _deliver(w, err)

    def data_received(self, data: bytes) -> None:
        self.last_reply = asyncio.get_running_loop().time()
        buf = self.buf
        if buf:
            buf += data
            src: bytes | bytearray = buf
        else:
            src = data
        pos, n = 0, len(src)
        waiters = self.waiters
        try:
            while pos < n:
                value, pos = _parse(src, pos)
                if waiters:
                    _deliver(waiters.popleft(), value)
        except _Incomplete:
            pass
        except ValueError as exc:  # a protocol error: this connection cannot be trusted any more
            if self.transport is not None:
                self.transport.abort()
            self.connection_lost(exc)
            return
        if src is buf:
            del buf[:pos]
        elif pos < n:
            self.buf = bytearray(data[pos:])

    def send(self, payload: bytes, waiter: Waiter) -> None:
        self.waiters.append(waiter)
        self.out.append(payload)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self.flush_scheduled = False
        out, self.out = self.out, []
        if self.alive and self.transport is not None and out:
            self.transport.write(b"".join(out) if len(out) > 1 else out[0])


def _deliver(w: Waiter, value: Reply | BaseException) -> None:
    if isinstance(w, asyncio.Future):
        if not w.done():
            if isinstance(value, BaseException) and not isinstance(value, RespError):
                w.set_exception(value)
            else:
                w.set_result(value)
    else:
        w(value)


class RespClient:
    """Commands over one pipelined connection, opened on first use and again after a loss."""

    def __init__(self, host: str, port: int, db: int = 0, username: str | None = None,
                 password: str | None = None, connect_timeout_s: float = 5.0, timeout_s: float = 5.0) -> None:
        self.host, self.port, self.db = host, port, db
        self.username, self.password = username, password
        self.connect_timeout_s = connect_timeout_s
        self.timeout_s = timeout_s  # ``call`` raises TimeoutError when no reply came in this time
        self._conn: _Conn | None = None
        self._connecting: asyncio.Future[_Conn] | None = None
        # Deadlines of the calls in flight, oldest first (one timeout for all: FIFO order is deadline
        # order), watched by one timer instead of a timeout handle per call.
        self._deadlines: deque[tuple[float, asyncio.Future[Reply]]] = deque()
        self._timer: asyncio.TimerHandle | None = None

    @property
    def stale_s(self) -> float:
        """A connection that owes replies and has said nothing for this long is dropped (and reopened)."""
        return max(2.0, 10 * self.timeout_s)

    def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        dl = self._deadlines
        expired = False
        while dl and (dl[0][1].done() or dl[0][0] <= now):
            _at, fut = dl.popleft()
            if not fut.done():
                fut.set_exception(TimeoutError())
                expired = True
        conn = self._conn
        if expired and conn is not None and conn.alive and conn.waiters and now - conn.last_reply > self.stale_s:
            if conn.transport is not None:
                conn.transport.abort()  # connection_lost fails what it still owes; the next call reconnects
        self._timer = loop.call_at(dl[0][0], self._watch) if dl else None

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.connect_timeout_s):
            _t, conn = await loop.create_connection(_Conn, self.host, self.port)
        hello: list[bytes] = []
        if self.password is not None:
            hello.append(command("AUTH", *((self.username,) if self.username else ()), self.password))
        if self.db:
            hello.append(command("SELECT", self.db))
        for payload in hello:
            fut: asyncio.Future[Reply] = loop.create_future()
            conn.send(payload, fut)
            async with asyncio.timeout(self.connect_timeout_s):
                reply = await fut
            if isinstance(reply, RespError):
                conn.transport.close() if conn.transport is not None else None
                raise ConnectionError(f"Redis refused the connection set-up: {reply}")
        return conn

    async def connection(self) -> _Conn:
        conn = self._conn
        if conn is not None and conn.alive:
            return conn
        if self._connecting is None:
            fut: asyncio.Future[_Conn] = asyncio.get_running_loop().create_future()
            self._connecting = fut
            try:
                conn = await self._connect()
            except BaseException as exc:
                fut.set_exception(exc if isinstance(exc, Exception) else ConnectionError("cancelled"))
                fut.exception()  # retrieved: no "never retrieved" warning when nobody else waits
                raise
            finally:
                self._connecting = None
            self._conn = conn
            fut.set_result(conn)
            return conn
        return await asyncio.shield(self._connecting)

    def connected(self) -> _Conn | None:
        """The live connection, or None (then ``connection()`` opens one)."""
        conn = self._conn
        return conn if conn is not None and conn.alive else None

    async def call(self, payload: bytes) -> Reply:
        """Send one pre-encoded command and wait for its reply (RespError values are returned);
        TimeoutError after ``timeout_s`` without one."""
        conn = self.connected() or await self.connection()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Reply] = loop.create_future()
        conn.send(payload, fut)
        at = loop.time() + self.timeout_s
        self._deadlines.append((at, fut))
        if self._timer is None:
            self._timer = loop.call_at(at, self._watch)
        return await fut

    def call_nowait(self, payload: bytes, callback: Callable[[Reply | BaseException], None]) -> bool:
        """Send on the live connection, the reply (or the error) to ``callback``; False when not connected."""
        conn = self.connected()
        if conn is None:
            return False
        conn.send(payload, callback)
        return True

    async def aclose(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        conn, self._conn = self._conn, None
        if conn is not None and conn.transport is not None:
            conn.flush()
            conn.transport.close()
