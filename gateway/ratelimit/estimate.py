"""Token cost before a request (an estimate) and after it (the real usage), per route kind.

The limiter itself only sees integers; these functions know the OpenAI shapes. Another API family
(Anthropic ``/v1/messages``) brings its own pair of functions.

Estimate = prompt estimate + completion budget. The prompt estimate is the body size in bytes / 4 (no
tokenizer on the hot path; JSON syntax makes it err on the high side, and the reconciliation corrects
it). The completion budget is ``max_completion_tokens`` / ``max_tokens`` / ``max_output_tokens`` (Anthropic's
``/v1/messages``: ``max_tokens``; its ``count_tokens`` costs no tokens), else
``default_max_tokens``, times ``n``, and never more than the backend's ``max_model_len`` minus the
prompt estimate (clients that always ask for 32000 tokens would otherwise be locked out).
"""

from __future__ import annotations

from typing import Any

_BUDGET_FIELDS: dict[str, tuple[str, ...]] = {
    "chat": ("max_completion_tokens", "max_tokens"),
    "completions": ("max_tokens",),
    "responses": ("max_output_tokens",),
    "embeddings": (),
    "messages": ("max_tokens",),  # Anthropic /v1/messages
}


def prompt_estimate(body_len: int) -> int:
    return body_len // 4 + 1


def estimate_openai(kind: str, payload: dict[str, Any], body_len: int, default_max_tokens: int,
                    max_model_len: int | None) -> int:
    if kind == "count_tokens":
        return 0  # Anthropic's token counting generates nothing: it costs a request, no tokens
    prompt = body_len // 4 + 1  # prompt_estimate, inline (once per limited request)
    fields = _BUDGET_FIELDS.get(kind, ())
    if not fields:
        return prompt
    # a positive JSON integer: `type() is int` also rules out a bool (orjson makes exact ints)
    for f in fields:
        budget = payload.get(f)
        if type(budget) is int and budget > 0:
            break
    else:
        budget = default_max_tokens
    if max_model_len is not None:
        budget = min(budget, max(1, max_model_len - prompt))
    n = payload.get("n")
    return prompt + (budget * n if type(n) is int and n > 0 else budget)


def usage_tokens(usage: Any) -> tuple[int, int] | None:
    """(prompt, completion) from an OpenAI ``usage`` object (chat/completions/embeddings or responses)."""
    if not isinstance(usage, dict):
        return None
    p = usage.get("prompt_tokens", usage.get("input_tokens"))
    c = usage.get("completion_tokens", usage.get("output_tokens", 0))
    if not isinstance(p, int) or not isinstance(c, int):
        return None
    return p, c


def usage_openai(kind: str, data: dict[str, Any]) -> tuple[int, int] | None:
    """Real usage from a non-streamed OpenAI answer (or a Responses stream's final event payload)."""
    return usage_tokens(data.get("usage"))
