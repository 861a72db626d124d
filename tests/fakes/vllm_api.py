"""vLLM 0.32 OpenAI-server semantics without an engine: request validation, error bodies, token
counting and response bodies, shaped like ../shared/vllm/captures.md (case numbers below).

Pure functions only; `fake_vllm.py` does the HTTP and the timing.

Token counting (deterministic stand-in for the tokenizer), chosen so that the captured usages come out:
  tokens(text)  = number of words and punctuation marks, i.e. len(re.findall(r"\\w+|[^\\w\\s]", text))
  chat prompt   = 2 + sum over messages of (7 + tokens(content))   # "Hello" -> 10 (#8), system+user -> 20 (#12)
  completion    = 1 + tokens(prompt)                               # "def main(" -> 4 (#51)
Generated text: token i of choice c is WORDS[(i + 5 * c) % len(WORDS)] (see `generated_tokens`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import struct
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

VERSION = "0.32.0"
SYSTEM_FINGERPRINT = "vllm-0.32.0-db2f3ee4"

# Answer of a request that found the engine dead (captures: "Dead engine").
ENGINE_DEAD_BODY = (
    b'{"error":{"message":"EngineCore encountered an issue. See stack trace (above) for the root cause.",'
    b'"type":"InternalServerError","param":null,"code":500}}'
)

WORDS = (
    "mb", "Test", " parser", "ingle", " st", "cs", " returns", " bo", "cmd", "speci", " Type", " result",
    " {", "wise", " entry", "ature", " This", "ary", " always", " buffer", "ations", "xtension", "lse",
    " fields", " b", "red", " struct", "LAG", " member", " P", "Base", " has", "Implemented", " x",
)  # fmt: skip


def dumps(obj: Any) -> bytes:
    """Starlette JSONResponse / pydantic encoding: compact, UTF-8, key order kept."""
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def random_hex(n: int = 16) -> str:
    return uuid.uuid4().hex[:n]


def generated_tokens(count: int, index: int = 0) -> list[str]:
    """The pseudo tokens the fake generates for choice `index` (deterministic)."""
    return [WORDS[(i + 5 * index) % len(WORDS)] for i in range(count)]


def count_tokens(text: str) -> int:
    return len(re.findall(r"\w+|[^\w\s]", text))


def content_text(content: Any) -> str:
    """Text of an OpenAI message `content`: a string or a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def chat_prompt_tokens(messages: Sequence[dict[str, Any]]) -> int:
    return 2 + sum(7 + count_tokens(content_text(m.get("content"))) for m in messages)


# ---------------------------------------------------------------------------------------------
# errors


class ApiError(Exception):
    """An error answer: status plus the exact JSON body vLLM sends."""

    def __init__(self, status: int, body: dict[str, Any]):
        super().__init__(body)
        self.status = status
        self.body = body


def error_body(message: str, type_: str, param: str | None, code: int) -> dict[str, Any]:
    return {"error": {"message": sanitize_message(message), "type": type_, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, error_body(message, "BadRequestError", param, 400))


def invalid_param(message: str, parameter: str, value: object = None) -> ApiError:
    """vLLM's VLLMValidationError: "<message> (parameter=p, value=v)"."""
    suffix = f"parameter={parameter}" if value is None else f"parameter={parameter}, value={value}"
    return bad_request(f"{message} ({suffix})", parameter)


def model_not_found(model: str, served: Sequence[str]) -> ApiError:
    message = f"The model `{model}` does not exist. Valid aliases: {', '.join(served)}."
    return ApiError(404, error_body(message, "NotFoundError", "model", 404))


def context_length_error(prompt_tokens: int, max_model_len: int) -> ApiError:
    shown = min(prompt_tokens, max_model_len + 1)  # vLLM stops tokenizing at max_model_len + 1
    return invalid_param(
        f"This model's maximum context length is {max_model_len} tokens. However, your prompt contains "
        f"at least {shown} input tokens, which exceeds this limit even without any output tokens. "
        "Please reduce the length of the input prompt.",
        "input_tokens",
        shown,
    )


def sanitize_message(message: str) -> str:
    """vLLM's `sanitize_message`, plus relative paths (capture #21 shows `./tiny-model` as `<path>`)."""
    message = re.sub(r" at 0x[0-9a-f]+>", ">", message)
    message = re.sub(r"/(?:home|usr|opt|var|tmp|root|lib|mnt|srv)(?:/[\w.\-]+)+", "<path>", message)
    message = re.sub(r"(?:/[\w\-]+)+/[\w\-]+\.\w+", "<path>", message)
    message = re.sub(r"(?<![\w/])\.{1,2}(?:/[\w.\-]+)+", "<path>", message)
    return message.strip()


def _summarize_input(value: object) -> object:
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        return f"<{type(value).__name__} of {len(value)} items>"
    text = value if isinstance(value, str) else str(value)
    return text[:200] + "...[truncated]" if len(text) > 200 else text


def _clean_loc(loc: Sequence[object]) -> str:
    internal = {"str", "int", "float", "bool", "list", "dict", "none", "union", "tagged-union", "nullable"}
    parts = [str(p) for p in loc if not re.search(r"[\[\]{}()]", str(p)) and str(p).lower() not in internal]
    return ".".join(parts or [str(p) for p in loc])


def validation_error(errors: Sequence[dict[str, Any] | str]) -> ApiError:
    """FastAPI RequestValidationError as vLLM renders it: type "Bad Request", param = pydantic loc."""
    rendered = []
    for err in errors[:10]:
        if isinstance(err, dict):
            err = dict(err)
            if "input" in err:
                err["input"] = _summarize_input(err["input"])
            err["loc"] = _clean_loc(err["loc"])
        rendered.append(str(err))
    label = "error" if len(errors) == 1 else "errors"
    message = f"{len(errors)} validation {label}:\n" + "".join(f"  {r}\n" for r in rendered)
    first = errors[0]
    param = _clean_loc(first["loc"]) if isinstance(first, dict) else None
    return ApiError(400, error_body(message.rstrip(), "Bad Request", param, 400))


UNSUPPORTED_MEDIA_TYPE = "Unsupported Media Type: Only 'application/json' is allowed"


def parse_json_body(body: bytes, content_type: str | None) -> Any:
    """FastAPI body handling + vLLM's `validate_json_request` dependency, in their order (#27-#29)."""
    media = (content_type or "").lower().split(";", 1)[0].strip()
    parsed: Any = None
    if body and (content_type is None or media == "application/json" or media.endswith("+json")):
        try:
            parsed = json.loads(body)
        except json.JSONDecodeError as exc:
            err = {"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error",
                   "input": {}, "ctx": {"error": exc.msg}}  # fmt: skip
            raise validation_error([err]) from exc
        except UnicodeDecodeError as exc:
            raise validation_error([UNSUPPORTED_MEDIA_TYPE]) from exc
    if media != "application/json":
        raise validation_error([UNSUPPORTED_MEDIA_TYPE])
    if not body:
        raise validation_error([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])
    return parsed


# ---------------------------------------------------------------------------------------------
# request models (only the fields the fake acts on; unknown fields are accepted, #49)


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    stream: bool | None = False
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = 1
    seed: int | None = None


class StreamOptions(BaseModel):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class ChatRequest(_Request):
    messages: list[dict[str, Any]]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stream_options: StreamOptions | None = None


class CompletionRequest(_Request):
    prompt: str | list[str] | list[int]
    max_tokens: int | None = 16
    stream_options: StreamOptions | None = None


class ResponsesRequest(_Request):
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None


class EmbeddingRequest(_Request):
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None


T = TypeVar("T", bound=BaseModel)


def validate(cls: type[T], body: Any) -> T:
    try:
        return cls.model_validate(body)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise validation_error(errors) from exc


def check_stream_options(req: ChatRequest | CompletionRequest) -> None:
    if req.stream_options is not None and not req.stream:
        raise invalid_param("Stream options can only be defined when `stream=True`.", "stream_options")


def check_sampling(req: _Request, max_tokens: int | None, max_tokens_param: str = "max_tokens") -> None:
    """SamplingParams._verify_args (#38-#43)."""
    if req.n is not None and req.n < 1:
        raise invalid_param(f"n must be at least 1, got {req.n}.", "n", req.n)
    if req.temperature is not None:
        t = float(req.temperature)
        if t < 0:
            raise invalid_param(f"temperature must be non-negative, got {t}.", "temperature", t)
        if t > 2:
            raise invalid_param(f"temperature must be in [0, 2], got {t}.", "temperature", t)
    if req.top_p is not None and not 0 < req.top_p <= 1:
        p = float(req.top_p)
        raise invalid_param(f"top_p must be in (0, 1], got {p}.", "top_p", p)
    if max_tokens is not None and max_tokens < 1:
        raise invalid_param(f"{max_tokens_param} must be at least 1, got {max_tokens}.", max_tokens_param, max_tokens)


def check_max_tokens(requested: int | None, max_model_len: int, param: str = "max_tokens") -> None:
    if requested is not None and requested > max_model_len:
        raise invalid_param(
            f"{param}={requested} cannot be greater than max_model_len={max_model_len}. "
            "Please request fewer output tokens.",
            param,
            requested,
        )


# ---------------------------------------------------------------------------------------------
# success bodies


@dataclass(frozen=True)
class Generation:
    """What one request generates: `choices[i]` is the token list of choice i."""

    id: str
    model: str
    created: int
    prompt_tokens: int
    choices: tuple[tuple[str, ...], ...]

    @property
    def completion_tokens(self) -> int:
        return sum(len(c) for c in self.choices)

    @staticmethod
    def make(
        id_prefix: str, model: str, prompt_tokens: int, tokens_per_choice: Sequence[int], id_hex: int = 16
    ) -> Generation:
        choices = tuple(tuple(generated_tokens(n, i)) for i, n in enumerate(tokens_per_choice))
        return Generation(f"{id_prefix}{random_hex(id_hex)}", model, int(time.time()), prompt_tokens, choices)


def usage(prompt: int, completion: int, *, details: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }
    if details:
        body |= {"prompt_tokens_details": None, "completion_tokens_details": None}
    return body


def chat_completion(gen: Generation) -> dict[str, Any]:  # capture #8
    choices = [
        {
            "index": i,
            "message": {"role": "assistant", "content": "".join(tokens), "refusal": None, "annotations": None,
                        "audio": None, "function_call": None, "reasoning": None},
            "logprobs": None, "finish_reason": "length", "stop_reason": None, "token_ids": None,
            "routed_experts": None,
        }
        for i, tokens in enumerate(gen.choices)
    ]  # fmt: skip
    return {
        "id": gen.id, "object": "chat.completion", "created": gen.created, "model": gen.model,
        "choices": choices, "service_tier": None, "system_fingerprint": SYSTEM_FINGERPRINT,
        "usage": usage(gen.prompt_tokens, gen.completion_tokens), "prompt_logprobs": None,
        "prompt_token_ids": None, "prompt_text": None, "kv_transfer_params": None, "ec_transfer_params": None,
        "metrics": None,
    }  # fmt: skip


def completion(gen: Generation) -> dict[str, Any]:  # capture #51
    choices = [
        {"index": i, "text": "".join(tokens), "logprobs": None, "finish_reason": "length", "stop_reason": None,
         "token_ids": None, "prompt_logprobs": None, "prompt_token_ids": None, "routed_experts": None}
        for i, tokens in enumerate(gen.choices)
    ]  # fmt: skip
    return {
        "id": gen.id, "object": "text_completion", "created": gen.created, "model": gen.model,
        "choices": choices, "service_tier": None, "system_fingerprint": SYSTEM_FINGERPRINT,
        "usage": usage(gen.prompt_tokens, gen.completion_tokens), "kv_transfer_params": None,
        "ec_transfer_params": None, "metrics": None,
    }  # fmt: skip


# A stream is a list of (step, payload): `step` is the index of the generated token the event waits
# for (None: sent without waiting), so the fake knows where to put first-token and inter-token delays.
Events = list[tuple[int | None, dict[str, Any]]]


def chat_stream_events(gen: Generation, include_usage: bool, continuous_usage: bool) -> Events:
    """SSE payloads of a chat stream (#9, #10, #11, #47).

    Role chunks for every choice come first (with the first token, as in vLLM), then tokens
    interleaved by step, then the usage chunk.
    """
    head = {"id": gen.id, "object": "chat.completion.chunk", "created": gen.created, "model": gen.model}
    running = usage(gen.prompt_tokens, 0, details=False) | {"completion_tokens_details": None}
    events: Events = []
    for i in range(len(gen.choices)):
        choice = {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        extra = {"usage": running} if continuous_usage else {}
        events.append((0, head | {"choices": [choice]} | extra | {"prompt_token_ids": None, "prompt_text": None}))
    for step in range(max((len(c) for c in gen.choices), default=0)):
        for i, tokens in enumerate(gen.choices):
            if step >= len(tokens):
                continue
            last = step == len(tokens) - 1
            choice = {"index": i, "delta": {"content": tokens[step]}, "logprobs": None,
                      "finish_reason": "length" if last else None}  # fmt: skip
            choice |= {"stop_reason": None, "token_ids": None} if last else {"token_ids": None}
            event = head | {"choices": [choice]}
            if continuous_usage:
                event["usage"] = usage(gen.prompt_tokens, step + 1, details=False) | {"completion_tokens_details": None}
            elif last and not include_usage:
                event["system_fingerprint"] = SYSTEM_FINGERPRINT
            events.append((step, event))
    if include_usage:
        final = usage(gen.prompt_tokens, gen.completion_tokens, details=False)
        events.append((None, head | {"choices": [], "usage": final, "system_fingerprint": SYSTEM_FINGERPRINT}))
    return events


def completion_stream_events(gen: Generation, include_usage: bool, continuous_usage: bool) -> Events:
    """SSE payloads of a completions stream (#52); no role chunk."""
    head = {"id": gen.id, "object": "text_completion", "created": gen.created, "model": gen.model}
    events: Events = []
    for step in range(max((len(c) for c in gen.choices), default=0)):
        for i, tokens in enumerate(gen.choices):
            if step >= len(tokens):
                continue
            last = step == len(tokens) - 1
            choice = {"index": i, "text": tokens[step], "logprobs": None, "finish_reason": "length" if last else None,
                      "stop_reason": None, "prompt_token_ids": None, "token_ids": None}  # fmt: skip
            event = head | {"choices": [choice]}
            if continuous_usage:
                event["usage"] = usage(gen.prompt_tokens, step + 1, details=False)
            elif last and not include_usage:
                event["system_fingerprint"] = SYSTEM_FINGERPRINT  # not captured; mirrors chat
            events.append((step, event))
    if include_usage:
        final = usage(gen.prompt_tokens, gen.completion_tokens, details=False)
        events.append((None, head | {"choices": [], "usage": final, "system_fingerprint": SYSTEM_FINGERPRINT}))
    return events


def responses_prompt_tokens(req: ResponsesRequest) -> int:
    messages: list[dict[str, Any]] = []
    if req.instructions:
        messages.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        messages.append({"role": "user", "content": req.input})
    else:
        messages += [m for m in req.input if isinstance(m, dict)]
    return chat_prompt_tokens(messages)


def response_object(gen: Generation, req: ResponsesRequest, max_output_tokens: int, status: str) -> dict[str, Any]:
    """vLLM's ResponsesResponse.model_dump() (field order of its pydantic model)."""
    done = status != "in_progress"
    text = "".join(gen.choices[0])
    output = [message_item(gen, text, "completed")] if done else []
    resp_usage = None
    if done:
        resp_usage = {
            "input_tokens": gen.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0, "input_tokens_per_turn": [], "cached_tokens_per_turn": []},
            "output_tokens": gen.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0, "output_tokens_per_turn": [],
                                      "tool_output_tokens_per_turn": []},
            "total_tokens": gen.prompt_tokens + gen.completion_tokens,
        }  # fmt: skip
    return {
        "id": gen.id, "created_at": gen.created,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": req.instructions, "metadata": req.metadata, "model": gen.model, "object": "response",
        "output": output, "parallel_tool_calls": True,
        "temperature": 1.0 if req.temperature is None else float(req.temperature), "tool_choice": "auto",
        "tools": [], "top_p": 1.0 if req.top_p is None else float(req.top_p), "background": False,
        "max_output_tokens": max_output_tokens, "max_tool_calls": None, "previous_response_id": None,
        "prompt": None, "reasoning": None, "service_tier": "auto", "status": status, "text": None,
        "top_logprobs": None, "truncation": "disabled", "usage": resp_usage, "user": req.user,
        "input_messages": None, "output_messages": None,
    }  # fmt: skip


def message_item(gen: Generation, text: str, status: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = (
        [{"annotations": [], "text": text, "type": "output_text", "logprobs": None}] if status == "completed" else []
    )
    return {"id": f"msg_{gen.id.removeprefix('resp_')}", "content": content, "role": "assistant", "status": status,
            "type": "message"}  # fmt: skip


def responses_stream_events(gen: Generation, req: ResponsesRequest, max_output_tokens: int) -> Events:
    """Events of vLLM's simple (non-harmony) Responses stream; each payload carries its `type`.

    The fake frames each as `event: <type>` + `data: <json>` (vLLM's `_convert_stream_to_sse_events`).
    """
    item_id = f"msg_{gen.id.removeprefix('resp_')}"
    text = "".join(gen.choices[0])
    in_progress = response_object(gen, req, max_output_tokens, "in_progress")
    new_part: dict[str, Any] = {"annotations": [], "text": "", "type": "output_text", "logprobs": []}
    done_part: dict[str, Any] = {"annotations": [], "text": text, "type": "output_text", "logprobs": None}
    raw: list[tuple[int | None, str, dict[str, Any]]] = [
        (None, "response.created", {"response": in_progress}),
        (None, "response.in_progress", {"response": in_progress}),
        (0, "response.output_item.added", {"item": message_item(gen, "", "in_progress"), "output_index": 0}),
        (0, "response.content_part.added",
         {"content_index": 0, "item_id": item_id, "output_index": 0, "part": new_part}),
    ]  # fmt: skip
    raw += [
        (step, "response.output_text.delta",
         {"content_index": 0, "delta": token, "item_id": item_id, "logprobs": [], "output_index": 0})
        for step, token in enumerate(gen.choices[0])
    ]  # fmt: skip
    raw += [
        (None, "response.output_text.done",
         {"content_index": 0, "item_id": item_id, "logprobs": [], "output_index": 0, "text": text}),
        (None, "response.content_part.done",
         {"content_index": 0, "item_id": item_id, "output_index": 0, "part": done_part}),
        (None, "response.output_item.done", {"item": message_item(gen, text, "completed"), "output_index": 0}),
        # the fake always stops on max_output_tokens, which vLLM reports as status "incomplete"
        (None, "response.completed", {"response": response_object(gen, req, max_output_tokens, "incomplete")}),
    ]  # fmt: skip
    return [(step, body | {"sequence_number": seq, "type": kind}) for seq, (step, kind, body) in enumerate(raw)]


def embedding_vector(text: str, dim: int) -> list[float]:
    """Deterministic unit vector derived from the text."""
    raw = hashlib.sha256(text.encode()).digest() * (dim // 32 + 1)
    values = [(b - 127.5) / 127.5 for b in raw[:dim]]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def embeddings(req: EmbeddingRequest, model: str, dim: int) -> tuple[dict[str, Any], int]:
    inputs: list[Any] = [req.input] if isinstance(req.input, str) or (
        req.input and isinstance(req.input[0], int)) else list(req.input)  # fmt: skip
    data, prompt_tokens = [], 0
    for i, item in enumerate(inputs):
        text = item if isinstance(item, str) else " ".join(map(str, item))
        prompt_tokens += (1 + count_tokens(item)) if isinstance(item, str) else len(item)
        vector = embedding_vector(text, req.dimensions or dim)
        value: list[float] | str = vector
        if req.encoding_format == "base64":
            value = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"index": i, "object": "embedding", "embedding": value})
    body = {
        "id": f"embd-{random_hex()}", "object": "list", "created": int(time.time()), "model": model, "data": data,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens, "completion_tokens": 0,
                  "prompt_tokens_details": None},
    }  # fmt: skip
    return body, prompt_tokens


def models_list(served: Sequence[str], root: str, max_model_len: int) -> dict[str, Any]:  # capture #3
    now = int(time.time())
    permission = {
        "id": f"modelperm-{random_hex()}", "object": "model_permission", "created": now,
        "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
        "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False, "organization": "*",
        "group": None, "is_blocking": False,
    }  # fmt: skip
    data = [
        {"id": name, "object": "model", "created": now, "owned_by": "vllm", "root": root, "parent": None,
         "max_model_len": max_model_len, "permission": [permission]}
        for name in served
    ]  # fmt: skip
    return {"object": "list", "data": data}


@dataclass(frozen=True)
class MetricValues:
    model_name: str
    running: float
    waiting: float
    kv_cache_usage: float
    success_length: float
    prompt_tokens: float
    generation_tokens: float


def metrics_text(m: MetricValues) -> str:
    """A small, well-formed subset of vLLM's /metrics (captures: Metrics)."""
    labels = f'engine="0",model_name="{m.model_name}"'
    families = [
        ("num_requests_running", "gauge", "Number of requests in model execution batches.", [("", m.running)]),
        ("num_requests_waiting", "gauge", "Number of requests waiting to be processed.", [("", m.waiting)]),
        ("kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", [("", m.kv_cache_usage)]),
        ("prompt_tokens_total", "counter", "Number of prefill tokens processed.", [("", m.prompt_tokens)]),
        ("generation_tokens_total", "counter", "Number of generation tokens processed.",
         [("", m.generation_tokens)]),
        ("request_success_total", "counter", "Count of successfully processed requests.",
         [(f'finished_reason="{r}",', m.success_length if r == "length" else 0.0)
          for r in ("stop", "length", "abort", "error", "repetition")]),
    ]  # fmt: skip
    lines = []
    for name, kind, help_, samples in families:
        lines += [f"# HELP vllm:{name} {help_}", f"# TYPE vllm:{name} {kind}"]
        for extra, value in samples:
            sample_labels = labels if not extra else f'engine="0",{extra}model_name="{m.model_name}"'
            lines.append(f"vllm:{name}{{{sample_labels}}} {float(value)!r}")
    return "\n".join(lines) + "\n"
