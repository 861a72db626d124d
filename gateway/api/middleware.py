"""Plain ASGI middleware (no BaseHTTPMiddleware: it would buffer streams and break contextvars).

For every HTTP request: normalise the path, assign the request id (the client's ``x-request-id``
when it is sane, else a new one), echo it on the response, count in-flight requests, record
request metrics and one access-log line at the very end (after the last streamed byte), and turn
any exception that escaped the app into a 500 in OpenAI's format when nothing was sent yet.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from gateway.api.anthropic import send_anthropic_error
from gateway.api.context import SCOPE_KEY, RequestContext
from gateway.api.errors import send_error
from gateway.api.routes import normalize_path, route_label
from gateway.errors import InternalError
from gateway.observability.metrics import Metrics, status_class

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

access = logging.getLogger("gateway.access")
log = logging.getLogger("gateway.api")

_SANE_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def _request_id(headers: list[tuple[bytes, bytes]]) -> str:
    for k, v in headers:
        if k == b"x-request-id":
            try:
                value = v.decode("ascii")
            except UnicodeDecodeError:
                break
            if _SANE_ID.match(value):
                return value
            break
    return os.urandom(16).hex()


class RequestContextMiddleware:
    def __init__(self, app: ASGIApp, metrics: Metrics, access_log: bool = True,
                 fast_posts: Mapping[str, ASGIApp] | None = None) -> None:
        self.app = app
        self.metrics = metrics
        self.access_log = access_log
        # POST endpoints served directly, skipping the framework's routing layers (the hot path);
        # any other method on those paths still goes through the app (405 with Allow).
        self.fast_posts = fast_posts or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        norm = normalize_path(path)
        if norm != path:
            scope["path"] = norm
            scope["raw_path"] = norm.encode()
        route = route_label(norm)
        started = time.perf_counter()
        ctx = RequestContext(_request_id(scope["headers"]), started, route)
        scope[SCOPE_KEY] = ctx
        rid_header = (b"x-request-id", ctx.request_id.encode())
        status = 0

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", ()))
                if not any(k.lower() == b"x-request-id" for k, _ in headers):
                    headers.append(rid_header)
                if ctx.extra_headers:
                    headers += ctx.extra_headers
                message["headers"] = headers
            await send(message)

        gauge = self.metrics.in_flight_of(route)
        gauge.inc()
        app = self.fast_posts.get(norm, self.app) if scope["method"] == "POST" else self.app
        try:
            await app(scope, receive, send_wrapper)
        except Exception:
            log.exception("unhandled error in %s %s", scope.get("method"), norm,
                          extra={"request_id": ctx.request_id})
            if status == 0:
                status = 500
                failed = InternalError("The gateway failed to handle this request.")
                if norm.startswith("/v1/messages"):
                    await send_anthropic_error(send, failed, ctx.request_id)
                else:
                    await send_error(send, failed, ctx.request_id)
        finally:
            gauge.dec()
            elapsed = time.perf_counter() - started
            if ctx.client_gone:
                self.metrics.client_disconnects.labels(ctx.model, route).inc()
            code = 499 if (ctx.client_gone or ctx.client_stalled) and status in (0, 200) else status
            series = self.metrics.series(ctx.model, route)
            series.count(status_class(code))
            series.latency.observe(elapsed)
            if ctx.ttfb is not None:
                series.ttfb.observe(ctx.ttfb)
            if self.access_log:
                access.info(
                    "%s %s %s %.1fms", scope.get("method"), norm, code, elapsed * 1000,
                    extra={
                        "request_id": ctx.request_id, "method": scope.get("method"), "path": norm,
                        "status": code, "duration_ms": round(elapsed * 1000, 2), "model": ctx.model,
                        "upstream": ctx.upstream, "key": ctx.key_name,
                        "ttfb_ms": None if ctx.ttfb is None else round(ctx.ttfb * 1000, 2),
                        "input_tokens": None if ctx.usage is None else ctx.usage[0],
                        "output_tokens": None if ctx.usage is None else ctx.usage[1],
                    },
                )
