"""A fast vLLM-like upstream for benchmarks: plain ASGI on uvicorn (httptools + uvloop).

It answers like vLLM 0.32's OpenAI server (``../shared/vllm/captures.md``), as cheaply as it can,
so that a benchmark measures the gateway and not the fake backend:

- ``GET /health``: 200, empty body, no key needed.
- ``GET /v1/models``: the served model (case #3).
- ``POST /v1/chat/completions``: non-streaming, a body shaped like case #8 with ``max_tokens``
  tokens (default 16); streaming, like case #10: a role delta, one content delta per token (the last
  one carries ``finish_reason``), a usage chunk when ``stream_options.include_usage`` is set, then
  ``data: [DONE]``. Each event is written as its own HTTP chunk, optionally ``--token-delay-ms``
  apart; the request header ``x-stub-token-delay-ms`` overrides the delay for one request (the bench's
  gateway config adds it to ``forward_headers.allow``).
- ``GET /metrics``: a vLLM 0.32 exposition as big as a real one (``--metrics-page``: a captured page,
  default ``tests/fixtures/vllm_metrics/busy.txt``) whose ``vllm:num_requests_running`` is the
  stub's live count of chat requests in flight (waiting and KV usage 0), for load-aware routing.
- ``GET /stub/served``: how many chat requests it has answered (``{"chat": n}``), for benchmarks.
- Every ``/v1`` path needs ``Authorization: Bearer <key>`` (scheme case-insensitive), else
  401 ``{"error":"Unauthorized"}``; an unknown ``model`` is vLLM's 404 ``NotFoundError``.

Run: ``python loadtest/upstream_stub.py --port 8011 --api-key sk-stub [--served-name tiny]``.
Listens on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import orjson
import uvicorn

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

FINGERPRINT = "vllm-0.32.0-db2f3ee4"
TOKENS = ("mb", "Test", "mb", "Test", "ingle", " parser")
MAX_BODY = 4 * 1024 * 1024

_JSON = [(b"content-type", b"application/json")]
_SSE = [(b"content-type", b"text/event-stream; charset=utf-8")]
_UNAUTHORIZED = b'{"error":"Unauthorized"}'


def _text(n: int) -> str:
    return "".join(TOKENS[i % len(TOKENS)] for i in range(n))


DEFAULT_METRICS_PAGE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "vllm_metrics" / "busy.txt"
_GAUGES = re.compile(rb"^(vllm:(?:num_requests_running|num_requests_waiting|kv_cache_usage_perc)\{[^}]*\}) .*$",
                     re.MULTILINE)


def metrics_template(page: bytes) -> tuple[bytes, bytes]:
    """The captured page split around its running gauge's value; waiting and KV usage set to 0."""
    def zero(m: re.Match[bytes]) -> bytes:
        return m.group(1) + (b" \x00" if b"num_requests_running" in m.group(1) else b" 0.0")

    head, _, tail = _GAUGES.sub(zero, page).partition(b"\x00")
    return head, tail


class StubApp:
    """The ASGI application; all answers are built from a few pre-rendered pieces."""

    def __init__(self, api_key: str | None, served_name: str, token_delay_s: float, max_model_len: int,
                 metrics_page: bytes = b"") -> None:
        self.in_flight = 0
        self.served_total = 0
        self.metrics_head, self.metrics_tail = metrics_template(metrics_page)
        self.api_key = api_key
        self.served = served_name
        self.token_delay_s = token_delay_s
        self.max_model_len = max_model_len
        self.models_body = orjson.dumps({
            "object": "list",
            "data": [{
                "id": served_name, "object": "model", "created": int(time.time()), "owned_by": "vllm",
                "root": "./tiny-model", "parent": None, "max_model_len": max_model_len,
                "permission": [{
                    "id": "modelperm-9a91fbc531a9db29", "object": "model_permission",
                    "created": int(time.time()), "allow_create_engine": False, "allow_sampling": True,
                    "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                    "allow_fine_tuning": False, "organization": "*", "group": None, "is_blocking": False,
                }],
            }],
        })

    # -- ASGI entry point --------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # lifespan is off; nothing else is served
        path: str = scope["path"]
        method: str = scope["method"]
        if path == "/health":
            await self._reply(send, 200, b"", [])
            return
        if path == "/stub/served":
            await self._reply(send, 200, orjson.dumps({"chat": self.served_total}))
            return
        if path == "/metrics":
            body = self.metrics_head + f"{float(self.in_flight)!r}".encode() + self.metrics_tail
            await self._reply(send, 200, body, [(b"content-type", b"text/plain; version=1.0.0; charset=utf-8")])
            return
        if path.startswith("/v1") and not self._authorized(scope["headers"]):
            await self._reply(send, 401, _UNAUTHORIZED)
            return
        if path == "/v1/models":
            if method != "GET":
                await self._reply(send, 405, b'{"detail":"Method Not Allowed"}')
                return
            await self._reply(send, 200, self.models_body)
            return
        if path == "/v1/chat/completions":
            if method != "POST":
                await self._reply(send, 405, b'{"detail":"Method Not Allowed"}')
                return
            self.in_flight += 1
            try:
                await self._chat(scope, receive, send)
            finally:
                self.in_flight -= 1
                self.served_total += 1
            return
        await self._reply(send, 404, b'{"detail":"Not Found"}')

    def _authorized(self, headers: list[tuple[bytes, bytes]]) -> bool:
        if self.api_key is None:
            return True
        for k, v in headers:
            if k == b"authorization":
                scheme, _, token = v.decode("latin-1").strip().partition(" ")
                return scheme.lower() == "bearer" and token.strip() == self.api_key
        return False

    @staticmethod
    async def _reply(
        send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        h = list(_JSON if headers is None else headers)
        h.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": h})
        await send({"type": "http.response.body", "body": body})

    @staticmethod
    def _error(message: str, typ: str, param: str | None, code: int) -> bytes:
        return orjson.dumps({"error": {"message": message, "type": typ, "param": param, "code": code}})

    # -- chat completions --------------------------------------------------------------------
    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body += msg.get("body", b"")
            if len(body) > MAX_BODY:
                await self._reply(send, 413, self._error("body too large", "BadRequestError", None, 413))
                return
            if not msg.get("more_body", False):
                break
        try:
            req = orjson.loads(body)
        except orjson.JSONDecodeError:
            await self._reply(send, 400, self._error("JSON decode error", "Bad Request", "body", 400))
            return
        if not isinstance(req, dict) or not isinstance(req.get("messages"), list):
            await self._reply(send, 400, self._error("Field required", "Bad Request", "body.messages", 400))
            return
        model = req.get("model")
        if model is not None and model != self.served:
            message = f"The model `{model}` does not exist. Valid aliases: {self.served}."
            await self._reply(send, 404, self._error(message, "NotFoundError", "model", 404))
            return
        max_tokens = req.get("max_tokens")
        n = max_tokens if isinstance(max_tokens, int) and 0 < max_tokens <= self.max_model_len else 16
        if req.get("stream") is True:
            opts = req.get("stream_options")
            usage = isinstance(opts, dict) and opts.get("include_usage") is True
            await self._stream(scope, send, n, usage)
            return
        await self._reply(send, 200, self._completion(n))

    def _completion(self, n: int) -> bytes:
        return orjson.dumps({
            "id": "chatcmpl-" + os.urandom(8).hex(), "object": "chat.completion", "created": int(time.time()),
            "model": self.served,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": _text(n), "refusal": None, "annotations": None,
                            "audio": None, "function_call": None, "reasoning": None},
                "logprobs": None, "finish_reason": "length", "stop_reason": None, "token_ids": None,
                "routed_experts": None,
            }],
            "service_tier": None, "system_fingerprint": FINGERPRINT,
            "usage": {"prompt_tokens": 10, "total_tokens": 10 + n, "completion_tokens": n,
                      "prompt_tokens_details": None, "completion_tokens_details": None},
            "prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None, "kv_transfer_params": None,
            "ec_transfer_params": None, "metrics": None,
        })

    def _delay(self, headers: list[tuple[bytes, bytes]]) -> float:
        for k, v in headers:
            if k == b"x-stub-token-delay-ms":
                try:
                    return max(0.0, float(v)) / 1000.0
                except ValueError:
                    break
        return self.token_delay_s

    async def _stream(self, scope: Scope, send: Send, n: int, usage: bool) -> None:
        delay = self._delay(scope["headers"])
        head = (
            b'data: {"id":"chatcmpl-' + os.urandom(8).hex().encode()
            + b'","object":"chat.completion.chunk","created":' + str(int(time.time())).encode()
            + b',"model":' + orjson.dumps(self.served) + b',"choices":['
        )
        await send({"type": "http.response.start", "status": 200, "headers": _SSE})
        events: list[bytes] = [
            head + b'{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],'
            b'"prompt_token_ids":null,"prompt_text":null}\n\n'
        ]
        for i in range(n):
            tok = orjson.dumps(TOKENS[i % len(TOKENS)])
            if i < n - 1:
                tail = b'"logprobs":null,"finish_reason":null,"token_ids":null}]}\n\n'
            elif usage:
                tail = b'"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null}]}\n\n'
            else:
                tail = (b'"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null}],'
                        b'"system_fingerprint":"' + FINGERPRINT.encode() + b'"}\n\n')
            events.append(head + b'{"index":0,"delta":{"content":' + tok + b"}," + tail)
        if usage:
            events.append(
                head + b'],"usage":{"prompt_tokens":10,"total_tokens":' + str(10 + n).encode()
                + b',"completion_tokens":' + str(n).encode() + b'},"system_fingerprint":"'
                + FINGERPRINT.encode() + b'"}\n\n'
            )
        events.append(b"data: [DONE]\n\n")
        last = len(events) - 1
        for i, event in enumerate(events):
            # Like vLLM: the role delta goes out at once, then one event per generated token; the
            # usage chunk and [DONE] follow the last token without a pause.
            if delay and 1 <= i <= n:
                await asyncio.sleep(delay)
            await send({"type": "http.response.body", "body": event, "more_body": i < last})


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--api-key", default="sk-stub", help="required bearer key; '' accepts any request")
    p.add_argument("--served-name", default="tiny", help="the model name this backend serves")
    p.add_argument("--token-delay-ms", type=float, default=0.0, help="pause between streamed tokens")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--metrics-page", type=Path, default=DEFAULT_METRICS_PAGE,
                   help="a captured vLLM /metrics page to serve (with live values)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    page = args.metrics_page.read_bytes() if args.metrics_page.is_file() else (
        b"vllm:num_requests_running{engine=\"0\"} 0.0\nvllm:num_requests_waiting{engine=\"0\"} 0.0\n"
        b"vllm:kv_cache_usage_perc{engine=\"0\"} 0.0\n")
    app = StubApp(args.api_key or None, args.served_name, args.token_delay_ms / 1000.0, args.max_model_len, page)
    try:
        import uvloop  # noqa: F401  (only checks that it is there)

        loop = "uvloop"
    except ImportError:
        loop = "asyncio"
    try:
        import httptools  # type: ignore[import-untyped,unused-ignore]  # noqa: F401

        http = "httptools"
    except ImportError:
        http = "h11"
    uvicorn.run(
        app, host="127.0.0.1", port=args.port, loop=loop, http=http, lifespan="off",
        log_level="warning", access_log=False, server_header=True, date_header=True,
        timeout_keep_alive=60,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
