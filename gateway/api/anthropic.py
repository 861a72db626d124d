"""The Anthropic Messages API dialect: ``POST /v1/messages`` and ``/v1/messages/count_tokens``.

vLLM 0.32 serves both routes itself; the gateway proxies them with the same keys, mapping,
fail-over and streaming as the OpenAI routes (``gateway.api.proxy``). What differs is here:

- the key comes from ``Authorization: Bearer`` or ``x-api-key`` (Authorization wins when both are
  sent); the backend always gets its own key as Bearer (the forwarder drops both client headers);
- errors use Anthropic's envelope (``gateway.api.anthropic_errors``) and carry ``request-id``;
- a stream is complete at ``message_stop`` (or at vLLM's own ``error`` event, whose type is
  normalised); a stream that fails after it started ends with one ``event: error``;
- usage is read as it goes by: input tokens from ``message_start``, output tokens from the last
  ``message_delta`` (streams), or ``usage`` (JSON answers), into ``ctx.usage``, which the rate
  limiter's reconcile step and the usage counters read where the proxy's relay ends;
- the limiter's headers are Anthropic's ``anthropic-ratelimit-*`` (``gateway.ratelimit.anthropic_headers``).
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from gateway.api import anthropic_errors
from gateway.api.context import RequestContext
from gateway.api.dialect import Headers, Send, header
from gateway.domain import Upstream
from gateway.errors import AuthenticationFailed, GatewayError, UpstreamBadResponse, UpstreamError
from gateway.ratelimit.anthropic_headers import to_anthropic

STREAM_ENDS: tuple[bytes, ...] = (b'"type":"message_stop"', b'"type":"error"')
_ERROR_EVENT = b'"type":"error"'
_INPUT = re.compile(rb'"input_tokens":(\d+)')
_OUTPUT = re.compile(rb'"output_tokens":(\d+)')


class AnthropicDialect:
    observes_events = True

    def credentials(self, headers: Headers) -> str | None:
        auth = header(headers, b"authorization")
        if auth is not None:
            return auth
        key = header(headers, b"x-api-key")
        if key is not None and key.strip():
            return "Bearer " + key.strip()
        raise AuthenticationFailed(
            "Missing API key. Send it as `x-api-key: <key>` or `Authorization: Bearer <key>` "
            "(the anthropic SDK and Claude Code do this with ANTHROPIC_API_KEY or ANTHROPIC_AUTH_TOKEN)."
        )

    def stream_ends(self, kind: str) -> tuple[bytes, ...]:
        return STREAM_ENDS

    def success_headers(self, request_id: str) -> list[tuple[bytes, bytes]]:
        return [(b"request-id", request_id.encode())]

    def rate_headers(self, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        return to_anthropic(headers)

    async def send_error(self, send: Send, err: GatewayError, request_id: str) -> None:
        await send_anthropic_error(send, err, request_id)

    def stream_error(self, err: GatewayError, request_id: str) -> bytes:
        return anthropic_errors.error_event(anthropic_errors.body_bytes(err, request_id))

    def accept(self, raw: bytes, kind: str, up: Upstream, ctx: RequestContext) -> dict[str, Any]:
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            data = None
        if not isinstance(data, dict):
            snippet = raw[:80].decode("utf-8", "replace")
            raise UpstreamBadResponse(
                f"Upstream {up.name} answered 200 with a body that is not a JSON object: {snippet!r}"
            )
        if kind == "count_tokens":
            ok = isinstance(data.get("input_tokens"), int)
            required = "input_tokens"
        else:
            ok = isinstance(data.get("content"), list)
            required = "content"
        if not ok:
            if "error" in data:
                err = data["error"]
                message = err.get("message") if isinstance(err, dict) else err
                raise UpstreamError(f"Upstream {up.name} reported an error: {message}")
            raise UpstreamBadResponse(
                f"Upstream {up.name} answered 200 without `{required}`; refusing to pass on a malformed answer."
            )
        usage = data.get("usage")
        if isinstance(usage, dict):
            inp, out = usage.get("input_tokens"), usage.get("output_tokens")
            if isinstance(inp, int) and isinstance(out, int):
                ctx.usage = (inp, out)
        return data

    def observe(self, out: bytes, ctx: RequestContext) -> bytes:
        if b'"usage"' in out:
            if b'"type":"message_start"' in out and (m := _INPUT.search(out)) is not None:
                ctx.usage = (int(m.group(1)), ctx.usage[1] if ctx.usage else 0)
            if b'"type":"message_delta"' in out:
                found = _OUTPUT.findall(out)
                if found:
                    ctx.usage = (ctx.usage[0] if ctx.usage else 0, int(found[-1]))
        if _ERROR_EVENT in out:
            out = _normalize_errors(out, ctx.request_id)
        return out


def _normalize_errors(out: bytes, request_id: str) -> bytes:
    """Rewrite the backend's ``error`` events (types like ``internal_error``) in Anthropic's terms."""
    sep = b"\r\n\r\n" if b"\r\n\r\n" in out else b"\n\n"
    parts = out.split(sep)
    fixed = [
        anthropic_errors.normalize_error_event(p, request_id)[: -2] if _ERROR_EVENT in p else p for p in parts
    ]
    return sep.join(fixed)


async def send_anthropic_error(send: Send, err: GatewayError, request_id: str | None) -> None:
    body = anthropic_errors.body_bytes(err, request_id)
    headers = [*anthropic_errors.headers(err, request_id), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


__all__ = ["AnthropicDialect", "send_anthropic_error"]
