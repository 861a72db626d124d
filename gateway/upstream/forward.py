"""Send a request to a model's upstreams, failing over before any byte reached the client.

The forwarder returns an open upstream response with a 2xx status (the caller streams or reads
it) or raises a :class:`~gateway.errors.GatewayError`. Retrying is limited to errors that mean
"this backend could not take the request" (connection refused, 5xx, wrong key or served name);
a timeout after the request was sent is not retried, so a slow generation is never duplicated.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from gateway.config.schema import LimitsSpec, RetrySpec, Timeouts
from gateway.domain import ModelEntry, Upstream
from gateway.errors import GatewayError, UpstreamBadResponse, UpstreamTimeout
from gateway.routing.health import HealthBoard
from gateway.routing.selector import Selector
from gateway.upstream.client import UpstreamClients
from gateway.upstream.idle import IdleTimer
from gateway.upstream.normalize import from_error_response, from_transport_error

log = logging.getLogger("gateway.upstream")

# Hop-by-hop headers (RFC 9110 7.6.1) plus the ones the gateway owns or must not pass on.
_DROP = frozenset({
    b"host", b"content-length", b"authorization", b"connection", b"keep-alive", b"proxy-authenticate",
    b"proxy-authorization", b"proxy-connection", b"te", b"trailer", b"trailers", b"transfer-encoding",
    b"upgrade", b"accept-encoding", b"cookie", b"x-request-id", b"content-type", b"expect",
})

ErrorHook = Callable[[Upstream, GatewayError], None]


def forward_headers(client_headers: Sequence[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The client's end-to-end headers, minus hop-by-hop and gateway-owned ones."""
    listed: set[bytes] = set()
    for k, v in client_headers:
        if k.lower() == b"connection":
            listed.update(t.strip().lower() for t in v.split(b","))
    return [(k, v) for k, v in client_headers if (kl := k.lower()) not in _DROP and kl not in listed]


@dataclass(slots=True)
class Opened:
    upstream: Upstream
    response: httpx.Response
    deadline: float  # loop time by which the whole exchange must end


class Forwarder:
    def __init__(
        self,
        clients: UpstreamClients,
        selector: Selector,
        board: HealthBoard,
        timeouts: Timeouts,
        retry: RetrySpec,
        limits: LimitsSpec,
        on_error: ErrorHook | None = None,
    ) -> None:
        self.clients = clients
        self.selector = selector
        self.board = board
        self.timeouts = timeouts
        self.retry = retry
        self.limits = limits
        self.on_error = on_error

    def _headers(self, up: Upstream, extra: list[tuple[bytes, bytes]], request_id: str) -> list[tuple[bytes, bytes]]:
        h = [
            (b"content-type", b"application/json"),
            (b"accept-encoding", b"identity"),
            (b"x-request-id", request_id.encode()),
        ]
        key = up.spec.api_key_value()
        if key:
            h.append((b"authorization", b"Bearer " + key.encode()))
        h.extend(extra)
        return h

    async def open(
        self,
        entry: ModelEntry,
        path: str,
        payload: dict[str, Any],
        client_headers: list[tuple[bytes, bytes]],
        request_id: str,
    ) -> Opened:
        loop = asyncio.get_running_loop()
        t = self.timeouts
        deadline = loop.time() + t.total
        extra = forward_headers(client_headers)
        last: GatewayError | None = None
        for up in self.selector.order(entry)[: self.retry.max_attempts]:
            payload["model"] = up.served_name
            # A bare Request, not client.build_request(): no URL merging and no cookie jar, so a
            # cookie one upstream response sets can never ride along on another user's request.
            request = httpx.Request("POST", self.clients.url(up, path), content=orjson.dumps(payload),
                                    headers=self._headers(up, extra, request_id))
            try:
                async with asyncio.timeout_at(min(deadline, loop.time() + t.first_byte)):
                    response = await self.clients.send(up, request)
            except TimeoutError:
                err: GatewayError = UpstreamTimeout(
                    f"Upstream {up.name} sent no response within {t.first_byte:g}s."
                )
            except httpx.HTTPError as exc:
                err = from_transport_error(exc, up)
                if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
                    self.board.mark_down(up.name, err.message)
            else:
                if response.status_code < 400:
                    return Opened(up, response, deadline)
                try:
                    body = await read_body(response, deadline, t.idle, 1 << 20, up)
                except GatewayError as exc:
                    err = exc
                else:
                    err = from_error_response(response.status_code, body, up, path)
            self.report(up, err)
            if not err.retryable:
                raise err
            last = err
        assert last is not None
        raise last

    def report(self, up: Upstream, err: GatewayError) -> None:
        level = logging.ERROR if err.code in ("upstream_auth_failed", "upstream_model_not_found") else (
            logging.WARNING if err.status >= 500 else logging.INFO)
        log.log(level, "upstream %s: %s", up.name, err.message,
                extra={"upstream": up.name, "error_code": err.code, "status": err.status})
        if self.on_error is not None:
            self.on_error(up, err)


async def read_body(
    response: httpx.Response, deadline: float, idle: float, max_bytes: int, up: Upstream
) -> bytes:
    """The whole (non-streaming) body, bounded in size, total time and silence; always closes."""
    parts: list[bytes] = []
    size = 0
    timer = IdleTimer(idle, deadline)
    try:
        async for chunk in response.aiter_raw():
            timer.touch()
            size += len(chunk)
            if size > max_bytes:
                raise UpstreamBadResponse(f"Upstream {up.name} sent a body over {max_bytes} bytes.")
            parts.append(chunk)
    except asyncio.CancelledError:
        if not timer.absorb():
            raise
        raise UpstreamTimeout(f"Upstream {up.name} stopped sending its response.") from None
    except httpx.HTTPError as exc:
        raise from_transport_error(exc, up) from None
    finally:
        timer.stop()
        await response.aclose()
    return b"".join(parts)


__all__ = ["Forwarder", "Opened", "forward_headers", "read_body"]
