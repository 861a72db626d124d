"""The two API families the load tool speaks: what to send, and how to read the answer.

Each `Api` builds the request (path, headers, JSON body) and folds the answer into an `Answer`:
for a non-streaming body with `read_body`, for a stream event by event with `read_event`. Errors
found in an answer are `Failure`s: a kind (grouping key) and one message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

ANTHROPIC_VERSION = "2023-06-01"


@dataclass(frozen=True)
class Failure(Exception):
    """What went wrong with one request: `kind` groups failures in the report, `message` is one example."""

    kind: str
    message: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


@dataclass
class Answer:
    """What the reader learnt from the answer so far."""

    first_token: bool = False  # set by read_event on the first event that carries generated text
    output_tokens: int | None = None
    done: bool = False  # the stream's proper end ([DONE] / message_stop) was seen
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RequestSpec:
    """What every request of a run asks for."""

    model: str
    prompt: str
    max_tokens: int
    stream: bool


class Api(Protocol):
    name: str
    path: str  # appended to the base URL (which has no /v1)

    def headers(self, key: str) -> dict[str, str]: ...

    def body(self, spec: RequestSpec) -> bytes: ...

    def read_body(self, data: bytes) -> Answer: ...

    def read_event(self, event: str, data: str, answer: Answer) -> None: ...


def _json(data: bytes | str, what: str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        snippet = data[:200].decode("utf-8", "replace") if isinstance(data, bytes) else data[:200]
        raise Failure("bad_response", f"{what} is not JSON: {snippet!r}") from None


def error_failure(status: int | None, data: bytes) -> Failure:
    """A Failure for an error answer: grouped by status and the error's code or type."""
    label = f"HTTP {status}" if status is not None else "stream error"
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError:
        text = data[:200].decode("utf-8", "replace").strip()
        return Failure(label, text or "(empty body)")
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        code = err.get("code")
        tag = code if isinstance(code, str) and code else err.get("type")
        kind = f"{label} {tag}" if isinstance(tag, str) and tag else label
        return Failure(kind, str(err.get("message", ""))[:300])
    if isinstance(err, str):  # vLLM's own 401: {"error":"Unauthorized"}
        return Failure(label, err[:300])
    return Failure(label, data[:200].decode("utf-8", "replace"))


class OpenAIChat:
    """POST /v1/chat/completions with `Authorization: Bearer`; streams ask for usage in the last chunk."""

    name = "openai"
    path = "/v1/chat/completions"

    def headers(self, key: str) -> dict[str, str]:
        return {"authorization": f"Bearer {key}", "content-type": "application/json"}

    def body(self, spec: RequestSpec) -> bytes:
        body: dict[str, Any] = {
            "model": spec.model,
            "messages": [{"role": "user", "content": spec.prompt}],
            "max_tokens": spec.max_tokens,
        }
        if spec.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return orjson.dumps(body)

    def read_body(self, data: bytes) -> Answer:
        body = _json(data, "the answer")
        if not isinstance(body, dict) or not isinstance(body.get("choices"), list):
            raise Failure("bad_response", f"no choices in the answer: {data[:200].decode('utf-8', 'replace')!r}")
        return Answer(first_token=True, output_tokens=_usage(body, "completion_tokens"), done=True)

    def read_event(self, event: str, data: str, answer: Answer) -> None:
        if data == "[DONE]":
            answer.done = True
            return
        chunk = _json(data, "a stream event")
        if not isinstance(chunk, dict):
            raise Failure("bad_stream", f"stream event is not an object: {data[:200]!r}")
        if "error" in chunk:
            raise error_failure(None, data.encode())
        if not answer.first_token:
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                if delta.get("content") or delta.get("reasoning_content") or choice.get("text"):
                    answer.first_token = True
                    break
        tokens = _usage(chunk, "completion_tokens")
        if tokens is not None:
            answer.output_tokens = tokens


class AnthropicMessages:
    """POST /v1/messages with `x-api-key` and `anthropic-version`; usage from message_start/message_delta.

    `bearer`: also send `Authorization: Bearer` (vLLM's own /v1/messages checks only that header)."""

    name = "anthropic"
    path = "/v1/messages"

    def __init__(self, bearer: bool = False) -> None:
        self.bearer = bearer

    def headers(self, key: str) -> dict[str, str]:
        headers = {"x-api-key": key, "anthropic-version": ANTHROPIC_VERSION, "content-type": "application/json"}
        if self.bearer:
            headers["authorization"] = f"Bearer {key}"
        return headers

    def body(self, spec: RequestSpec) -> bytes:
        body: dict[str, Any] = {
            "model": spec.model,
            "max_tokens": spec.max_tokens,
            "messages": [{"role": "user", "content": spec.prompt}],
        }
        if spec.stream:
            body["stream"] = True
        return orjson.dumps(body)

    def read_body(self, data: bytes) -> Answer:
        body = _json(data, "the answer")
        if not isinstance(body, dict) or body.get("type") != "message":
            raise Failure("bad_response", f"not a message: {data[:200].decode('utf-8', 'replace')!r}")
        return Answer(first_token=True, output_tokens=_usage(body, "output_tokens"), done=True)

    def read_event(self, event: str, data: str, answer: Answer) -> None:
        payload = _json(data, "a stream event")
        if not isinstance(payload, dict):
            raise Failure("bad_stream", f"stream event is not an object: {data[:200]!r}")
        kind = payload.get("type") or event
        if kind == "error":
            raise error_failure(None, data.encode())
        if kind == "message_start":
            message = payload.get("message")
            tokens = _usage(message, "output_tokens") if isinstance(message, dict) else None
        elif kind == "content_block_delta":
            delta = payload.get("delta") or {}
            if delta.get("text") or delta.get("thinking") or delta.get("partial_json"):
                answer.first_token = True
            tokens = None
        elif kind == "message_delta":
            tokens = _usage(payload, "output_tokens")
        else:
            if kind == "message_stop":
                answer.done = True
            tokens = None
        if tokens is not None:
            answer.output_tokens = tokens


def _usage(obj: dict[str, Any], field_name: str) -> int | None:
    usage = obj.get("usage")
    if isinstance(usage, dict):
        value = usage.get(field_name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


APIS = ("anthropic", "openai")


def make_api(name: str, *, bearer: bool = False) -> Api:
    if name == "openai":
        return OpenAIChat()
    if name == "anthropic":
        return AnthropicMessages(bearer=bearer)
    raise ValueError(f"unknown API {name!r} (one of {', '.join(APIS)})")
