"""The proxied OpenAI endpoints, as plain ASGI endpoints (full control of bytes and timing).

Flow: authenticate -> read and parse the body once -> resolve the public model for this key ->
forward (with fail-over) -> relay the SSE stream or return the checked JSON body. A watcher on the
ASGI ``receive`` channel cancels the work the moment the client disconnects, which closes the
upstream connection so vLLM aborts the generation.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import httpx
import orjson

from gateway.api.context import RequestContext, context_of
from gateway.api.errors import send_error
from gateway.api.routes import ProxyRoute
from gateway.api.validate import parse_payload, read_body
from gateway.domain import ModelEntry
from gateway.errors import GatewayError, UpstreamError, UpstreamTimeout
from gateway.services import Services
from gateway.upstream import forward
from gateway.upstream.idle import IdleTimer
from gateway.upstream.normalize import check_success_body, from_transport_error
from gateway.upstream.sse import CHAT_END, RESPONSES_END, SseRelay, error_event

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope["headers"]:
        if k == name:
            return str(v.decode("latin-1"))
    return None


class ProxyEndpoint:
    def __init__(self, route: ProxyRoute, services: Services) -> None:
        self.route = route
        self.s = services

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = context_of(scope)
        s = self.s
        try:
            principal = s.keys.authenticate(_header(scope, b"authorization"))
            ctx.key_name = principal.name
            body = await read_body(scope["headers"], receive, s.config.limits.max_body_bytes)
            payload = parse_payload(body, self.route)
            entry = s.table.resolve(payload["model"], principal)
        except GatewayError as err:
            await send_error(send, err, ctx.request_id)
            return
        ctx.model = entry.id
        stream = payload.get("stream") is True and self.route.kind != "embeddings"
        await self._until_disconnect(receive, self._serve(scope, send, ctx, entry, payload, stream), ctx)

    async def _until_disconnect(self, receive: Receive, work: Awaitable[None], ctx: RequestContext) -> None:
        task = asyncio.current_task()
        assert task is not None
        finished = False
        gone = False

        async def watch() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            if not finished:
                gone = True
                task.cancel()

        watcher = asyncio.create_task(watch())
        try:
            await work
        except asyncio.CancelledError:
            if not gone:
                raise
            task.uncancel()
            ctx.client_gone = True
        finally:
            finished = True
            watcher.cancel()

    async def _serve(
        self, scope: Scope, send: Send, ctx: RequestContext, entry: ModelEntry,
        payload: dict[str, Any], stream: bool,
    ) -> None:
        s = self.s
        try:
            opened = await s.forwarder.open(entry, self.route.path, payload, scope["headers"], ctx.request_id)
        except GatewayError as err:
            await send_error(send, err, ctx.request_id)
            return
        ctx.upstream = opened.upstream.name
        ctype = opened.response.headers.get("content-type", "")
        if stream and ctype.startswith("text/event-stream"):
            await self._relay(send, ctx, entry, opened)
            return
        up = opened.upstream
        ctx.ttfb = time.perf_counter() - ctx.started  # vLLM sends a whole answer's headers with its body
        try:
            raw = await forward.read_body(
                opened.response, opened.deadline, s.config.timeouts.idle,
                s.config.limits.max_response_bytes, up,
            )
            data = check_success_body(raw, self.route.kind, up)
        except GatewayError as err:
            s.forwarder.report(up, err)
            await send_error(send, err, ctx.request_id)
            return
        if "model" in data:
            data["model"] = entry.id
        out = orjson.dumps(data)
        await send({
            "type": "http.response.start",
            "status": opened.response.status_code,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(out)).encode())],
        })
        await send({"type": "http.response.body", "body": out, "more_body": False})

    async def _relay(self, send: Send, ctx: RequestContext, entry: ModelEntry, opened: forward.Opened) -> None:
        s = self.s
        up = opened.upstream
        response = opened.response
        relay = SseRelay(up.served_name, entry.id, RESPONSES_END if self.route.kind == "responses" else CHAT_END)
        idle = s.config.timeouts.idle
        err: GatewayError | None = None
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        timer = IdleTimer(idle, opened.deadline)
        try:
            async for chunk in response.aiter_raw():
                timer.touch()
                if ctx.ttfb is None:
                    ctx.ttfb = time.perf_counter() - ctx.started
                out = relay.feed(chunk)
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
                    timer.touch()  # time spent waiting on a slow client is not upstream silence
        except asyncio.CancelledError:
            if not timer.absorb():
                raise
            err = UpstreamTimeout(
                "The request exceeded the total time limit." if timer.total_exceeded()
                else f"Upstream {up.name} sent nothing for {idle:g}s in the middle of the stream.")
        except httpx.HTTPError as exc:
            err = from_transport_error(exc, up)
        finally:
            timer.stop()
            await response.aclose()
        tail = relay.flush()
        if not relay.saw_done:
            if err is None:
                err = UpstreamError(
                    f"Upstream {up.name} ended the stream before it was complete.", code="upstream_disconnected"
                )
            s.forwarder.report(up, err)
            tail += error_event(err.body_bytes())
        await send({"type": "http.response.body", "body": tail, "more_body": False})
