"""uvicorn's httptools protocol with the guards a server facing careless or hostile clients needs.

uvicorn (0.54) parses with httptools, which buffers a header name, value or URL without any cap (and
re-copies it per chunk), never times out a connection before its first request, waits for a body
forever, and counts connections only to answer 503 after a whole request arrived. This subclass adds:

- head size: request line + headers at most ``max_head_bytes``; beyond, 414 (the URL is what is
  long) or 431 at once, without feeding the parser one byte more;
- header timeout: the whole head within ``header_timeout_s`` of its first byte, however slowly it
  trickles (slowloris), else 408; body timeout: the whole body within ``body_timeout_s`` of the
  head (a body slower than that, or shorter than its Content-Length), else 408;
- idle timeout: a connection that sends no request, or nothing more after a response, is closed
  after ``idle_timeout_s`` (uvicorn's keep-alive timer, armed at connect too);
- connection cap: at ``max_connections``, a new connection pushes out the oldest one that has no
  request under way (idle or still sending its head); when every connection is busy it is refused;
- HTTP/1.0: a streamed answer (no Content-Length) is delimited by closing, never chunked;
- half-close: a client that shuts down its sending side after a complete request still gets the
  answer; a full close is told apart by a probe (see :meth:`GatewayHttpProtocol.eof_received`);
- response head: uvicorn's checks, cheaper (see :class:`_Cycle`).

The common request (head and body in one read) arms no timer beyond uvicorn's own: the header and
body timers are armed only when a read leaves a head or body incomplete. Errors answered here use the
OpenAI error format, and the connection is closed after a short lingering read (so the client reads
the answer instead of a reset).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import weakref
from asyncio import TimerHandle
from collections.abc import Callable
from typing import Any

from uvicorn._types import ASGISendEvent
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string
from uvicorn.server import ServerState

from gateway.errors import GatewayError
from gateway.http.disconnect import DISCONNECT_HOOK
from gateway.http.fds import FdWatch
from gateway.http.limits import ServerLimits

log = logging.getLogger("gateway.server")

_TCP_CLOSE = 7  # tcpi_state once the peer answered our write with a reset
_HALF_CLOSE_PROBE_S = 0.25
_LINGER_MAX_BYTES = 1 << 20  # after an answer given here, drop this much of what still comes, then close


class _ServerGuard:
    """What the connections of one server (one event loop) share: the cap and its eviction order."""

    def __init__(self, server_state: ServerState, limits: ServerLimits, loop: asyncio.AbstractEventLoop) -> None:
        self.cap = limits.max_connections
        self.connections = server_state.connections
        # Connections with no request under way (idle, or still sending a head), oldest first.
        self.waiting: dict[GatewayHttpProtocol, None] = {}
        self.refused = 0
        self.fds = FdWatch(loop, lambda: len(self.connections))

    def make_room(self) -> bool:
        """At the cap: close the oldest waiting connection; False when there is none."""
        while self.waiting:
            victim = next(iter(self.waiting))
            del self.waiting[victim]
            if not victim.transport.is_closing():
                victim.transport.close()
                return True
        return False


_GUARDS: weakref.WeakKeyDictionary[ServerState, _ServerGuard] = weakref.WeakKeyDictionary()


def _error_response(status: int, code: str, message: str) -> bytes:
    body = GatewayError(message, status=status, type="invalid_request_error", code=code).body_bytes()
    return b"".join([STATUS_LINE[status], b"content-type: application/json\r\ncontent-length: ",
                     str(len(body)).encode(), b"\r\nconnection: close\r\n\r\n", body])


class GatewayHttpProtocol(HttpToolsProtocol):
    def __init__(self, config: Config, server_state: ServerState, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None, *, limits: ServerLimits) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.limits = limits
        self.max_head_bytes = limits.max_head_bytes
        self.timeout_keep_alive = limits.idle_timeout_s  # type: ignore[assignment]  # float is fine
        guard = _GUARDS.get(server_state)
        if guard is None:
            guard = _GUARDS[server_state] = _ServerGuard(server_state, limits, self.loop)
        self.guard = guard
        self.head_bytes = 0  # bytes fed since the last head ended (or the connection opened)
        self.url_buffer: bytearray | None = None  # the URL of a head under way (None: no head begun)
        self.in_body = False  # between the end of a head and the end of its body
        self.rejected = False  # answered here: what the client still sends is dropped
        self.dropped = 0
        self.deadline: TimerHandle | None = None  # header or body timer
        self.probe: TimerHandle | None = None  # half-closed connection: has the peer gone for good?

    # -- connection --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        guard = self.guard
        if len(self.connections) > guard.cap and not guard.make_room():
            guard.refused += 1
            if guard.refused == 1 or guard.refused % 1000 == 0:
                log.warning("connection cap reached (%d connections, all with a request under way): "
                            "refused %d connection(s) so far", guard.cap, guard.refused,
                            extra={"error_code": "connection_cap"})
            transport.close()
            return
        guard.waiting[self] = None
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive,
                                                            self.timeout_keep_alive_handler)

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.waiting.pop(self, None)
        self._cancel_deadline()
        if self.probe is not None:
            self.probe.cancel()
            self.probe = None
        super().connection_lost(exc)
        cycle = self.cycle
        if cycle is not None and cycle.disconnected:
            _notify_disconnect(cycle)

    def data_received(self, data: bytes) -> None:
        if self.rejected:  # lingering after an answer given here: drop, up to a point
            self.dropped += len(data)
            if self.dropped > _LINGER_MAX_BYTES and not self.transport.is_closing():
                self.transport.close()
            return
        if not self.in_body:
            room = self.max_head_bytes - self.head_bytes
            if len(data) > room:
                self._over_room(memoryview(data), room)
                return
            self.head_bytes += len(data)
        HttpToolsProtocol.data_received(self, data)
        # Usually the whole request arrived: no timer. Else one for the rest of the head or body.
        if (self.deadline is None and (self.in_body or self.head_bytes or self.url_buffer is not None)
                and not self.transport.is_closing()):
            self._arm_deadline()

    def _over_room(self, data: memoryview, room: int) -> None:
        # Feed only what fits; if the head ends within it, the rest is body (or the next request).
        self.head_bytes += room
        super().data_received(data[:room])  # type: ignore[arg-type]  # httptools takes any buffer
        if self.rejected or self.transport.is_closing():
            return
        if self.head_bytes >= self.max_head_bytes:  # no head ended within the room
            self._reject_head()
            return
        self.data_received(data[room:])  # type: ignore[arg-type]

    def _reject_head(self) -> None:
        url = self.url_buffer or b""
        limit = self.limits.max_head_bytes
        if len(url) >= self.head_bytes - 32:  # nothing but the method precedes the URL so far
            self._reject(414, "uri_too_long", f"The request URL is longer than {limit} bytes.")
        else:
            self._reject(431, "request_header_fields_too_large",
                         f"The request line and headers are longer than {limit} bytes.")

    def send_400_response(self, msg: str) -> None:
        self.rejected = True
        self._cancel_deadline()
        self.transport.write(_error_response(400, "invalid_http_request", msg))
        self.transport.close()

    # -- parser callbacks ----------------------------------------------------------------------
    def on_url(self, url: bytes) -> None:
        # uvicorn's `self.url += url` re-copies the URL for every piece that arrives
        if self.url_buffer is None:
            self.url_buffer = bytearray(url)
        else:
            self.url_buffer += url

    def on_headers_complete(self) -> None:
        self.url = bytes(self.url_buffer) if self.url_buffer is not None else b""
        self.url_buffer = None
        self.head_bytes = 0
        self.in_body = True
        if self.deadline is not None:
            self._cancel_deadline()
        self.guard.waiting.pop(self, None)
        previous = self.cycle
        HttpToolsProtocol.on_headers_complete(self)
        cycle = self.cycle
        if cycle is not previous:  # its task has not run yet: every send goes through the subclass
            cycle.__class__ = _Http10Cycle if self.scope["http_version"] == "1.0" else _Cycle
            self.scope[DISCONNECT_HOOK] = cycle  # type: ignore[literal-required]  # gateway.http.disconnect

    def on_message_complete(self) -> None:
        self.in_body = False
        if self.deadline is not None:
            self._cancel_deadline()
        HttpToolsProtocol.on_message_complete(self)

    def on_response_complete(self) -> None:
        HttpToolsProtocol.on_response_complete(self)
        if not self.transport.is_closing() and not self.pipeline:
            self.guard.waiting[self] = None

    # -- timers ----------------------------------------------------------------------------------
    def _arm_deadline(self) -> None:
        if self.in_body:
            self.deadline = self.loop.call_later(self.limits.body_timeout_s, self._body_timeout)
        elif self.head_bytes or self.url_buffer is not None:
            self.deadline = self.loop.call_later(self.limits.header_timeout_s, self._head_timeout)

    def _cancel_deadline(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _busy(self) -> bool:
        """A response is being made for an earlier request on this connection."""
        return self.cycle is not None and not self.cycle.response_complete

    def _head_timeout(self) -> None:
        self.deadline = None
        if self.transport.is_closing():
            return
        if self._busy():  # a pipelined head waits for the answer before it: not the client's delay
            self._arm_deadline()
            return
        if self.url_buffer is None:  # stray bytes between requests (e.g. a CRLF): an idle connection
            self.transport.close()
            return
        log.info("request head not complete within %gs: 408", self.limits.header_timeout_s,
                 extra={"client": self._client(), "error_code": "request_timeout"})
        self._reject(408, "request_timeout",
                     f"The request line and headers did not arrive within {self.limits.header_timeout_s:g}s.")

    def _body_timeout(self) -> None:
        self.deadline = None
        if self.transport.is_closing():
            return
        if self.flow.read_paused or self.pipeline:  # we stopped reading (back-pressure): not the client
            self._arm_deadline()
            return
        cycle = self.cycle
        log.info("request body not complete within %gs: 408", self.limits.body_timeout_s,
                 extra={"client": self._client(), "error_code": "request_timeout"})
        if cycle is not None and cycle.response_started:
            self.transport.close()  # answered already (without reading the body): just end it
            return
        self._reject(408, "request_timeout",
                     f"The request body did not arrive within {self.limits.body_timeout_s:g}s "
                     "(sent too slowly, or shorter than its Content-Length).")
        if cycle is not None:  # the application sees a disconnect; its answer goes nowhere
            cycle.disconnected = True
            cycle.message_event.set()
            _notify_disconnect(cycle)

    def _reject(self, status: int, code: str, message: str) -> None:
        """Answer ``status`` here and close after a short lingering read; parse nothing more."""
        self.rejected = True
        self._cancel_deadline()
        self._unset_keepalive_if_required()
        self.guard.waiting.pop(self, None)
        transport = self.transport
        if self._busy() and self.cycle.response_started:
            transport.close()  # cannot put an answer inside another one
            return
        transport.write(_error_response(status, code, message))
        try:
            transport.write_eof()
        except (NotImplementedError, OSError, RuntimeError):
            transport.close()
            return
        self.loop.call_later(self.limits.linger_s, transport.close)

    def _client(self) -> str:
        return f"{self.client[0]}:{self.client[1]}" if self.client else "-"

    # -- half-close ------------------------------------------------------------------------------
    def eof_received(self) -> bool | None:  # type: ignore[override]  # asyncio allows True
        """The client will send nothing more. With a complete request under way, keep the socket
        open to send its answer; otherwise close.

        A client that *closed* its socket sends the same FIN as one that only shut down its sending
        side; to still abort the work for a client that is gone, an HTTP/1.1 connection whose answer
        has not started gets an interim ``100 Continue`` (clients must accept one): a closed peer
        answers it with a reset, which the probe below notices and reports as a disconnect.
        """
        cycle = self.cycle
        if self.rejected or cycle is None or cycle.response_complete or self.in_body or self.url_buffer is not None:
            return None
        cycle.keep_alive = False
        if not cycle.response_started and self.scope["http_version"] == "1.1":
            cycle.waiting_for_100_continue = False
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if hasattr(socket, "TCP_INFO"):
            self.probe = self.loop.call_later(_HALF_CLOSE_PROBE_S, self._probe_peer)
        return True

    def _probe_peer(self) -> None:
        self.probe = None
        if self.transport.is_closing() or self.cycle is None or self.cycle.response_complete:
            return
        sock = self.transport.get_extra_info("socket")
        try:
            state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
        except (OSError, AttributeError):
            return
        if state == _TCP_CLOSE:
            self.transport.close()  # the peer is gone: uvicorn reports a disconnect to the app
            return
        self.probe = self.loop.call_later(_HALF_CLOSE_PROBE_S, self._probe_peer)


def _notify_disconnect(cycle: RequestResponseCycle) -> None:
    callback = getattr(cycle, "on_disconnect", None)
    if callback is not None:
        cycle.on_disconnect = None  # type: ignore[attr-defined]  # (a _Cycle: set on a class swap)
        callback()


_PLAIN_NAMES: set[bytes] = set()  # response header names seen valid, lowercase, and not about framing
_PLAIN_NAMES_MAX = 1024


class _Cycle(RequestResponseCycle):
    """uvicorn's response start, with the same checks at less cost per header (a response carries
    10-15): a header name already seen valid and lowercase is not matched against the regular
    expression again, nor lowercased, nor compared with the framing names; a value of letters and
    digits only (``x-ratelimit-*`` counts, lengths) needs no expression to be known safe.

    It is also the request's :class:`~gateway.http.disconnect.DisconnectHook`."""

    on_disconnect: Callable[[], None] | None = None

    async def send(self, message: ASGISendEvent) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        if self.response_started:
            if self.response_complete or message["type"] != "http.response.body":
                await super().send(message)  # uvicorn's errors for messages out of order
                return
            # uvicorn's body branch, here rather than through super(): no second coroutine per chunk
            body = message.get("body", b"")
            more_body = message.get("more_body", False)
            if self.scope["method"] == "HEAD":
                self.expected_content_length = 0
            elif self.chunked_encoding:
                if body:
                    self.transport.write(b"".join((b"%x\r\n" % len(body), body, b"\r\n0\r\n\r\n" if not more_body
                                                   else b"\r\n")))
                elif not more_body:
                    self.transport.write(b"0\r\n\r\n")
            else:
                if len(body) > self.expected_content_length:
                    raise RuntimeError("Response content longer than Content-Length")
                self.expected_content_length -= len(body)
                self.transport.write(body)
            if not more_body:
                if self.expected_content_length != 0:
                    raise RuntimeError("Response content shorter than Content-Length")
                self.response_complete = True
                self.message_event.set()
                if not self.keep_alive:
                    self.transport.close()
                self.on_response()
            return
        if message["type"] != "http.response.start":
            await super().send(message)
            return
        self.response_started = True
        self.waiting_for_100_continue = False
        status_code = message["status"]
        headers = self.default_headers + list(message.get("headers", []))
        if self.access_log:
            self.access_logger.info('%s - "%s %s HTTP/%s" %d', get_client_addr(self.scope), self.scope["method"],
                                    get_path_with_query_string(self.scope), self.scope["http_version"],
                                    status_code)
        content = [STATUS_LINE[status_code]]
        has_connection_close = False
        plain = _PLAIN_NAMES
        for name, value in headers:
            if name in plain:
                if not value.isalnum() and HEADER_VALUE_RE.search(value):
                    raise RuntimeError("Invalid HTTP header value.")
            else:  # uvicorn's loop body
                if HEADER_RE.search(name):
                    raise RuntimeError("Invalid HTTP header name.")
                if HEADER_VALUE_RE.search(value):
                    raise RuntimeError("Invalid HTTP header value.")
                lname = name.lower()
                if lname == b"content-length":
                    if self.chunked_encoding is None:
                        self.expected_content_length = int(value.decode())
                        self.chunked_encoding = False
                elif lname == b"transfer-encoding":
                    if value.lower() == b"chunked":
                        self.expected_content_length = 0
                        self.chunked_encoding = True
                elif lname == b"connection":
                    if b"close" in [token.lower().strip() for token in value.split(b",")]:
                        self.keep_alive = False
                        has_connection_close = True
                elif lname == name and len(plain) < _PLAIN_NAMES_MAX:
                    plain.add(name)
                name = lname
            content += (name, b": ", value, b"\r\n")
        if not self.keep_alive and not has_connection_close:
            content.append(b"connection: close\r\n")
        if self.chunked_encoding is None and self.scope["method"] != "HEAD" and status_code not in (204, 304):
            self.chunked_encoding = True  # neither content-length nor transfer-encoding
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        self.transport.write(b"".join(content))


class _Http10Cycle(_Cycle):
    """HTTP/1.0 has no chunked encoding: an answer without Content-Length ends when the connection does."""

    close_delimited = False

    async def send(self, message: ASGISendEvent) -> None:
        if message["type"] == "http.response.start" and not self.response_started:
            headers = message.get("headers", [])
            framed = any(k.lower() in (b"content-length", b"transfer-encoding") for k, _ in headers)
            if not framed and self.scope["method"] != "HEAD" and message["status"] not in (204, 304):
                self.close_delimited = True
                self.keep_alive = False
                self.chunked_encoding = False  # uvicorn adds no transfer-encoding header then
        elif message["type"] == "http.response.body" and self.close_delimited and not self.response_complete:
            if self.flow.write_paused and not self.disconnected:
                await self.flow.drain()
            if self.disconnected:
                return
            self.transport.write(message.get("body", b""))
            if not message.get("more_body", False):
                self.response_complete = True
                self.message_event.set()
                self.transport.close()
                self.on_response()
            return
        await super().send(message)
