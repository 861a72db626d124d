"""What differs between the API families the proxy serves (OpenAI, Anthropic), behind one protocol.

The request flow in ``gateway.api.proxy`` is the same for every family (authenticate, read and
parse once, resolve, forward with fail-over, relay or return); a :class:`Dialect` supplies only
the parts that differ: where the key comes from, the error envelope, how a stream ends and how a
failure is reported inside one, and which success body is acceptable.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any, Protocol

from gateway.api.context import RequestContext
from gateway.api.errors import send_error
from gateway.domain import Upstream
from gateway.errors import GatewayError
from gateway.upstream.normalize import check_success_body
from gateway.upstream.sse import CHAT_END, RESPONSES_END, error_event

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
Headers = Sequence[tuple[bytes, bytes]]


class Dialect(Protocol):
    observes_events: bool  # True: `observe` sees every relayed stream piece

    def credentials(self, headers: Headers) -> str | None:
        """The ``Authorization`` value to check (``Bearer <key>``), or None."""
        ...

    def stream_ends(self, kind: str) -> tuple[bytes, ...]:
        """Byte patterns that show a stream of this route kind is complete (see ``SseRelay``)."""
        ...

    def success_headers(self, request_id: str) -> list[tuple[bytes, bytes]]:
        ...

    def rate_headers(self, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """The limiter's ``x-ratelimit-*`` headers in this family's terms."""
        ...

    async def send_error(self, send: Send, err: GatewayError, request_id: str) -> None:
        ...

    def stream_error(self, err: GatewayError, request_id: str) -> bytes:
        """What ends a stream that failed after it started."""
        ...

    def accept(self, raw: bytes, kind: str, up: Upstream, ctx: RequestContext) -> dict[str, Any]:
        """The parsed 2xx body, checked, or a GatewayError."""
        ...

    def observe(self, out: bytes, ctx: RequestContext) -> bytes:
        """Relayed stream bytes (complete events), possibly rewritten."""
        ...


def header(headers: Headers, name: bytes) -> str | None:
    for k, v in headers:
        if k == name:
            return str(v.decode("latin-1"))
    return None


class OpenAIDialect:
    observes_events = False

    def credentials(self, headers: Headers) -> str | None:
        return header(headers, b"authorization")

    def stream_ends(self, kind: str) -> tuple[bytes, ...]:
        return RESPONSES_END if kind == "responses" else CHAT_END

    def success_headers(self, request_id: str) -> list[tuple[bytes, bytes]]:
        return []

    def rate_headers(self, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        return headers

    async def send_error(self, send: Send, err: GatewayError, request_id: str) -> None:
        await send_error(send, err, request_id)

    def stream_error(self, err: GatewayError, request_id: str) -> bytes:
        return error_event(err.body_bytes())

    def accept(self, raw: bytes, kind: str, up: Upstream, ctx: RequestContext) -> dict[str, Any]:
        return check_success_body(raw, kind, up)

    def observe(self, out: bytes, ctx: RequestContext) -> bytes:
        return out


__all__ = ["Dialect", "OpenAIDialect", "header"]
