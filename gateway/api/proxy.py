"""The proxied endpoints (OpenAI and Anthropic), as plain ASGI endpoints (full control of bytes and timing).

Flow: authenticate -> read and parse the body once -> resolve the public model for this key ->
rate-limit (only when a limit applies) -> forward (with fail-over) -> relay the SSE stream or return
the checked JSON body -> settle the limits and record the usage (one ``finally``). The route's
dialect (``gateway.api.dialect``: OpenAI or Anthropic) supplies the key header, the error envelope,
the rate-limit headers and the stream's end and error events; the flow is the same for both. The moment
the client disconnects the work is cancelled (told by the server's callback, ``gateway.http.disconnect``,
or by a watcher on the ASGI ``receive`` channel under another server), which closes the upstream
connection so vLLM aborts the generation.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import httpx
import orjson

from gateway.api.anthropic import AnthropicDialect
from gateway.api.context import RequestContext, context_of
from gateway.api.dialect import Dialect, OpenAIDialect
from gateway.api.routes import ProxyRoute
from gateway.api.validate import parse_payload, read_body
from gateway.domain import ModelEntry
from gateway.errors import GatewayError, ShuttingDown, UpstreamError, UpstreamRejected, UpstreamTimeout
from gateway.http.disconnect import DISCONNECT_HOOK, DisconnectHook
from gateway.ratelimit.estimate import estimate_openai, usage_openai
from gateway.ratelimit.service import Ticket
from gateway.ratelimit.stream_usage import UsageTap, ask_for_usage
from gateway.routing.affinity import affinity_key
from gateway.services import Services
from gateway.upstream import forward
from gateway.upstream.idle import IdleTimer
from gateway.upstream.normalize import from_transport_error
from gateway.upstream.sse import SseRelay

log = logging.getLogger("gateway.api")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


_SHUTDOWN = "The gateway is shutting down and ended this request; retry it (another replica will take it)."
_DIALECTS: dict[str, Dialect] = {"openai": OpenAIDialect(), "anthropic": AnthropicDialect()}
_TAPPED = ("chat", "completions", "responses")  # OpenAI streams whose usage the UsageTap reads


class ProxyEndpoint:
    def __init__(self, route: ProxyRoute, services: Services) -> None:
        self.route = route
        self.s = services
        self.dialect = _DIALECTS[route.dialect]
        self._ends = self.dialect.stream_ends(route.kind)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ctx = context_of(scope)
        s = self.s
        try:
            principal = s.keys.authenticate(self.dialect.credentials(scope["headers"]))
            ctx.key_name = principal.name
            body = await read_body(scope["headers"], receive, s.config.limits.max_body_bytes)
            payload = parse_payload(body, self.route)
            entry = s.table.resolve(payload["model"], principal)
        except GatewayError as err:
            await self.dialect.send_error(send, err, ctx.request_id)
            return
        ctx.model = entry.id
        stream = payload.get("stream") is True and self.route.kind != "embeddings"
        ticket: Ticket | None = None
        plan = s.ratelimits.plan(principal, entry)
        if plan is not None:
            estimate = estimate_openai(self.route.kind, payload, len(body),
                                       s.config.rate_limits.default_max_tokens, entry.max_model_len)
            try:
                ticket = await s.ratelimits.admit(plan, estimate)
            except GatewayError as err:
                await self.dialect.send_error(send, err, ctx.request_id)
                return
            headers = ticket.headers
            if headers:  # the middleware adds them to whatever response this request gets
                ctx.extra_headers = self.dialect.rate_headers(headers)
        try:
            work = self._serve(scope, send, ctx, entry, payload, stream)
            await self._until_disconnect(scope, receive, send, work, ctx)
        finally:
            usage = ctx.usage
            if ticket is not None:
                s.ratelimits.settle(ticket, None if usage is None else usage[0] + usage[1])
            if usage is not None:
                s.metrics.count_tokens(principal.name, entry.id, usage[0], usage[1])
                s.usage.record(principal.name, entry.id, usage[0], usage[1])
            elif ctx.upstream is not None:
                s.usage.record(principal.name, entry.id, 0, 0)

    async def _until_disconnect(self, scope: Scope, receive: Receive, send: Send, work: Awaitable[None],
                                ctx: RequestContext) -> None:
        """Run ``work`` until it ends or the client disconnects (then it is cancelled). At the end of a
        graceful shutdown it is cancelled too: a stream ends itself with an error event (``_relay``),
        a request whose answer has not started gets 503 ``gateway_shutting_down``."""
        task = asyncio.current_task()
        assert task is not None
        finished = False
        gone = False

        def on_gone() -> None:
            nonlocal gone
            if not finished:
                gone = True
                task.cancel()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            on_gone()

        # The server's callback when it offers one (gateway.http.disconnect), else a task on receive()
        hook: DisconnectHook | None = scope.get(DISCONNECT_HOOK)
        watcher: asyncio.Task[None] | None = None
        if hook is not None:
            hook.on_disconnect = on_gone
            if hook.disconnected:
                on_gone()
        else:
            watcher = asyncio.create_task(watch())
        active = self.s.lifecycle.active
        active.add(task)
        try:
            await work
        except asyncio.CancelledError:
            if gone:
                task.uncancel()
                ctx.client_gone = True
            elif not ctx.responded and self.s.lifecycle.absorb_cut():
                await self.dialect.send_error(send, ShuttingDown(_SHUTDOWN), ctx.request_id)
            else:
                raise
        finally:
            finished = True
            active.discard(task)
            if watcher is not None:
                watcher.cancel()
            elif hook is not None:
                hook.on_disconnect = None

    async def _serve(
        self, scope: Scope, send: Send, ctx: RequestContext, entry: ModelEntry,
        payload: dict[str, Any], stream: bool,
    ) -> None:
        s = self.s
        requested = payload["model"]  # the public ID or alias the client sent: answers carry it back
        tap: UsageTap | None = None
        if stream and self.route.kind in _TAPPED:
            kind = self.route.kind
            tap = UsageTap(kind, strip=kind in ("chat", "completions") and not ask_for_usage(payload))
        try:
            opened = await s.forwarder.open(entry, self.route.path, payload, scope["headers"], ctx.request_id,
                                            affinity_key=affinity_key(entry.affinity, scope["headers"], payload),
                                            fallbacks=s.table.fallbacks_of(entry))
        except GatewayError as err:
            if isinstance(err, UpstreamRejected):
                ctx.usage = (0, 0)  # the backend refused it: nothing was generated
            await self.dialect.send_error(send, err, ctx.request_id)
            return
        ctx.upstream = opened.upstream.name
        try:
            await self._answer(send, ctx, requested, opened, stream, tap)
        finally:
            opened.release()  # out of the upstream's in-flight count: whole body, stream end, error or disconnect

    async def _answer(self, send: Send, ctx: RequestContext, requested: str, opened: forward.Opened,
                      stream: bool, tap: UsageTap | None) -> None:
        s = self.s
        served = (b"x-gateway-served-by", opened.served_by.encode())
        ctx.extra_headers = [*ctx.extra_headers, served] if ctx.extra_headers else [served]
        if stream and opened.response.headers.get("content-type", "").startswith("text/event-stream"):
            await self._relay(send, ctx, requested, opened, tap)
            return
        up = opened.upstream
        ctx.ttfb = time.perf_counter() - ctx.started  # vLLM sends a whole answer's headers with its body
        try:
            raw = await forward.read_body(
                opened.response, opened.deadline, opened.idle,
                s.config.limits.max_response_bytes, up,
            )
            data = self.dialect.accept(raw, self.route.kind, up, ctx)
        except GatewayError as err:
            s.forwarder.report(up, err)
            await self.dialect.send_error(send, err, ctx.request_id)
            return
        if "model" in data:
            data["model"] = requested
        if ctx.usage is None:
            ctx.usage = usage_openai(self.route.kind, data)
        out = orjson.dumps(data)
        ctx.responded = True
        await send({
            "type": "http.response.start",
            "status": opened.response.status_code,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(out)).encode()),
                        *self.dialect.success_headers(ctx.request_id)],
        })
        await send({"type": "http.response.body", "body": out, "more_body": False})

    async def _relay(self, send: Send, ctx: RequestContext, requested: str, opened: forward.Opened,
                     tap: UsageTap | None) -> None:
        s = self.s
        up = opened.upstream
        response = opened.response
        relay = SseRelay(up.served_name, requested, self._ends)
        observe = self.dialect.observe if self.dialect.observes_events else None
        idle = opened.idle
        err: GatewayError | None = None
        ctx.responded = True
        await send({"type": "http.response.start", "status": 200,
                    "headers": [*_SSE_HEADERS, *self.dialect.success_headers(ctx.request_id)]})
        stall = s.config.timeouts.client_stall
        timer = IdleTimer(idle, opened.deadline, stall)
        try:
            async for chunk in response.aiter_raw():
                timer.touch()
                if ctx.ttfb is None:
                    ctx.ttfb = time.perf_counter() - ctx.started
                out = relay.feed(chunk)
                if out and tap is not None:
                    out = tap.scan(out)
                if out and observe is not None:
                    out = observe(out, ctx)
                if out:
                    timer.sending()  # time blocked on a slow client is not upstream silence
                    await send({"type": "http.response.body", "body": out, "more_body": True})
                    timer.touch()
        except asyncio.CancelledError:
            if not timer.absorb():
                if not s.lifecycle.absorb_cut():
                    raise
                err = ShuttingDown(_SHUTDOWN)
            elif timer.client_stalled:
                # The client's failure: it read nothing for `stall` seconds with the socket buffers
                # full. `finally` closes the upstream (the generation is aborted); nothing more is
                # sent (it would block again), the connection is closed, the backend is not blamed.
                ctx.client_stalled = True
                s.metrics.client_stalls.labels(ctx.model, ctx.route).inc()
                log.warning("client read nothing of its stream for %gs: stream cut (client stalled; "
                            "upstream %s not at fault)", stall, up.name,
                            extra={"request_id": ctx.request_id, "upstream": up.name, "error_code": "client_stalled"})
                return
            else:
                err = UpstreamTimeout(
                    "The request exceeded the total time limit." if timer.total_exceeded()
                    else f"Upstream {up.name} sent nothing for {idle:g}s in the middle of the stream.")
        except httpx.HTTPError as exc:
            err = from_transport_error(exc, up)
        finally:
            timer.stop()
            await response.aclose()
        tail = relay.flush()
        if tap is not None:
            tail = tap.scan(tail)
            ctx.usage = tap.usage
        elif tail and observe is not None:
            tail = observe(tail, ctx)
        if not relay.saw_done:
            if err is None:
                err = UpstreamError(
                    f"Upstream {up.name} ended the stream before it was complete.", code="upstream_disconnected"
                )
            if not isinstance(err, ShuttingDown):
                s.forwarder.report(up, err)
            tail += self.dialect.stream_error(err, ctx.request_id)
        await send({"type": "http.response.body", "body": tail, "more_body": False})
