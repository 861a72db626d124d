"""What is sent and what must come back: targets, request bytes, response checks, and the cases A-D."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

PUBLIC_MODEL = "bench-model"
SERVED_MODEL = "tiny"
STUB_KEY = "sk-stub-bench-0123456789"
CLIENT_KEY = "sk-bench-client-0123456789"
HOST = "127.0.0.1"


@dataclass(frozen=True)
class Target:
    name: str  # direct, nginx, floor, gateway
    port: int
    key: str
    model: str  # the model name sent
    answers_as: str  # the model name in the answers (the gateway maps it back; nginx and the floor do not)


@dataclass(frozen=True)
class Scenario:
    name: str
    request: bytes
    stream: bool
    marker: bytes  # must be in the body (once per JSON event when streaming)
    forbidden: bytes | None  # must not be in the body (the served name, through the gateway)
    events: int  # SSE events expected, [DONE] included (0: not a stream)


@dataclass(frozen=True)
class Case:
    """One row of the issue's table: a load and the number it is judged by."""

    name: str
    title: str
    scenario: str  # chat | stream
    concurrency: int
    requests: int  # per target and round
    tokens: int  # content chunks per stream (max_tokens for chat)
    delay_ms: float  # stub pause between streamed tokens
    metric: str  # added_p50_ms | rps | chunks_per_s | added_ttfb_p99_ms | errors


CASES: dict[str, Case] = {c.name: c for c in (
    Case("A", "non-streaming, concurrency 1: added p50", "chat", 1, 1000, 16, 0.0, "added_p50_ms"),
    Case("B", "non-streaming, concurrency 64: req/s and proxy CPU per request", "chat", 64, 3000, 16, 0.0, "rps"),
    Case("C", "32-chunk streams, concurrency 64: chunks/s", "stream", 64, 600, 32, 0.0, "chunks_per_s"),
    Case("D", "200 streams, 20 ms/chunk: added time-to-first-chunk p99", "stream", 200, 200, 32, 20.0,
         "added_ttfb_p99_ms"),
    Case("E", "1,000 concurrent streams, 20 ms/chunk: errors", "stream", 1000, 1000, 32, 20.0, "errors"),
)}  # fmt: skip


def http_request(method: str, path: str, port: int, key: str | None, body: bytes | None = None,
                 extra: Sequence[tuple[str, str]] = ()) -> bytes:  # fmt: skip
    lines = [f"{method} {path} HTTP/1.1", f"Host: {HOST}:{port}", "User-Agent: bench-proxy"]
    if key is not None:
        lines.append(f"Authorization: Bearer {key}")
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


def _chat_body(model: str, stream: bool, tokens: int) -> bytes:
    body: dict[str, Any] = {
        "model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": tokens,
        "temperature": 0,
    }
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body, separators=(",", ":")).encode()


def make_scenario(name: str, t: Target, tokens: int, delay_ms: float) -> Scenario:
    marker = b'"model":' + json.dumps(t.answers_as).encode()
    forbidden = b'"model":' + json.dumps(SERVED_MODEL).encode() if t.answers_as != SERVED_MODEL else None
    if name == "chat":
        req = http_request("POST", "/v1/chat/completions", t.port, t.key, _chat_body(t.model, False, tokens))
        return Scenario(name, req, False, marker, forbidden, 0)
    if name == "stream":
        extra = [("x-stub-token-delay-ms", f"{delay_ms:g}")]
        req = http_request("POST", "/v1/chat/completions", t.port, t.key, _chat_body(t.model, True, tokens), extra)
        # role delta + one event per token + usage chunk + [DONE]
        return Scenario(name, req, True, marker, forbidden, tokens + 3)
    raise ValueError(f"unknown scenario {name!r}")


def check_response(sc: Scenario, status: int, body: bytes) -> str | None:
    """Why this response is wrong, or None."""
    if status != 200:
        return f"status {status}: {body[:200]!r}"
    if not sc.stream:
        if sc.marker not in body:
            return f"{sc.marker.decode()} missing from the body: {body[:200]!r}"
        return None
    if not body.endswith(b"data: [DONE]\n\n"):
        return f"the stream does not end with data: [DONE]: {body[-200:]!r}"
    events = body.count(b"data: ")
    if events != sc.events:
        return f"{events} SSE events, expected {sc.events}"
    if body.count(sc.marker) != sc.events - 1:
        return f"{body.count(sc.marker)} of {sc.events - 1} chunks carry {sc.marker.decode()}"
    if sc.forbidden is not None and sc.forbidden in body:
        return f"a chunk still carries the served name {sc.forbidden.decode()}"
    return None
