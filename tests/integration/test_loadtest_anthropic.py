"""`gateway loadtest --api anthropic` against a small Anthropic Messages server on real uvicorn.

The gateway's own /v1/messages route is not here yet; this server speaks the Messages API the way
Anthropic documents it (x-api-key, anthropic-version, the SSE event sequence, usage in message_start
and message_delta, `event: error` mid-stream). The real vLLM tier checks vLLM's own /v1/messages.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from gateway.cli import main

KEY = "sk-ant-test"
Scope = dict[str, Any]


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


class MessagesApp:
    """Raw ASGI: POST /v1/messages. A prompt containing "overload" fails mid-stream with an error event."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], dict[str, Any]]] = []

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        if scope["path"] != "/v1/messages":
            return await self._json(send, 404, {"type": "error", "error": {"type": "not_found_error",
                                                                            "message": "no route"}})
        if headers.get("x-api-key") != KEY or "anthropic-version" not in headers:
            return await self._json(send, 401, {"type": "error", "error": {"type": "authentication_error",
                                                                            "message": "invalid x-api-key"}})
        req = json.loads(body)
        self.requests.append((headers, req))
        n = int(req["max_tokens"])
        prompt = req["messages"][0]["content"]
        if not req.get("stream"):
            return await self._json(send, 200, {
                "id": "msg_1", "type": "message", "role": "assistant", "model": req["model"],
                "content": [{"type": "text", "text": "word " * n}], "stop_reason": "max_tokens",
                "usage": {"input_tokens": 5, "output_tokens": n}})
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]})
        events = [_sse("message_start", {"type": "message_start", "message": {
            "id": "msg_1", "type": "message", "role": "assistant", "model": req["model"], "content": [],
            "usage": {"input_tokens": 5, "output_tokens": 1}}}),
            _sse("content_block_start", {"type": "content_block_start", "index": 0,
                                         "content_block": {"type": "text", "text": ""}}),
            _sse("ping", {"type": "ping"})]
        for _ in range(n):
            events.append(_sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                       "delta": {"type": "text_delta", "text": "word "}}))
        if "overload" in prompt:
            events.append(_sse("error", {"type": "error", "error": {"type": "overloaded_error",
                                                                    "message": "Overloaded"}}))
        else:
            events += [_sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
                       _sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": "max_tokens"},
                                              "usage": {"output_tokens": n}}),
                       _sse("message_stop", {"type": "message_stop"})]
        for event in events:
            await send({"type": "http.response.body", "body": event, "more_body": True})
            await asyncio.sleep(0.001)
        await send({"type": "http.response.body", "body": b""})

    @staticmethod
    async def _json(send: Any, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})


@pytest.fixture
def messages_server() -> Iterator[tuple[str, MessagesApp]]:
    app = MessagesApp()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False, lifespan="off"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "messages server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def run(tmp_path: Path, url: str, *extra: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "a.json"
    rc = main(["loadtest", "--api", "anthropic", "--base-url", url, "--model", "claude-x", "--no-progress",
               "--json", str(out), *extra])
    return rc, json.loads(out.read_text())


def test_anthropic_stream_reads_usage_and_ttft(messages_server: tuple[str, MessagesApp], tmp_path: Path) -> None:
    url, app = messages_server
    rc, doc = run(tmp_path, url, "--key", KEY, "-n", "12", "-c", "3", "--stream", "--max-tokens", "5")
    assert rc == 0
    s = doc["targets"][0]
    assert (s["ok"], s["output_tokens"]) == (12, 60)
    assert s["ttft_s"] is not None and s["ttft_s"]["p50"] <= s["latency_s"]["p50"]
    headers, body = app.requests[0]
    assert headers["x-api-key"] == KEY and headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in headers
    assert body["stream"] is True and body["max_tokens"] == 5 and body["model"] == "claude-x"


def test_anthropic_non_stream_and_errors(messages_server: tuple[str, MessagesApp], tmp_path: Path) -> None:
    url, app = messages_server
    rc, doc = run(tmp_path, url, "--key", KEY, "-n", "4", "--max-tokens", "7", "--bearer")
    assert rc == 0 and doc["targets"][0]["output_tokens"] == 28
    assert app.requests[-1][0]["authorization"] == f"Bearer {KEY}"

    rc, doc = run(tmp_path, url, "--key", "sk-wrong", "-n", "3")
    assert rc == 1
    assert doc["targets"][0]["errors"] == [{"kind": "HTTP 401 authentication_error", "count": 3,
                                            "example": "invalid x-api-key"}]

    rc, doc = run(tmp_path, url, "--key", KEY, "-n", "3", "--stream", "--prompt", "overload please")
    assert rc == 1
    s = doc["targets"][0]
    assert s["status_counts"] == {"200": 3}
    assert s["errors"] == [{"kind": "stream error overloaded_error", "count": 3, "example": "Overloaded"}]
