"""Pure parts of the rate limiter: plans, OpenAI headers and 429 bodies, estimates, the stream usage tap."""

from __future__ import annotations

import orjson
import pytest

from gateway.config.schema import LimitSpec
from gateway.ratelimit.estimate import estimate_openai, usage_openai
from gateway.ratelimit.limiter import Outcome
from gateway.ratelimit.plan import build_plan
from gateway.ratelimit.service import openai_duration, rate_headers, refusal, too_large
from gateway.ratelimit.stream_usage import UsageTap, ask_for_usage


def test_openai_duration_format() -> None:
    assert [openai_duration(x) for x in (0, 20, 999.2, 1000, 1200, 59_999, 60_000, 360_000, 3_723_000)] == [
        "0ms", "20ms", "1s", "1s", "1.2s", "59.999s", "1m0s", "6m0s", "1h2m3s"]


def test_plan_is_none_without_limits_and_tags_keys_per_client_key() -> None:
    assert build_plan("a", "m", None, None, None) is None
    plan = build_plan("team-a", "big-70b", LimitSpec(rpm=600, tpm=200000, max_parallel=16),
                      LimitSpec(rpm=60, burst_requests=6), LimitSpec(tpm=500000))
    assert plan is not None
    assert [(i.key, i.kind, i.capacity, i.shared) for i in plan.items] == [
        ("{k:team-a}:rl:rq", "requests", 600, False), ("{k:team-a}:rl:tk", "tokens", 200000, False),
        ("{k:team-a}:rl:pl", "parallel", 16, False), ("{k:team-a}:rl:big-70b:rq", "requests", 6, False),
        ("{m:big-70b}:rl:tk", "tokens", 500000, True)]
    assert plan.token_capacity == 200000 and plan.has_gates
    odd = build_plan("we{ir}d", "m", LimitSpec(rpm=1), None, None)
    assert odd is not None and odd.items[0].key.startswith("{k:we%7Bir%7Dd}")


def test_429_body_headers_and_tightest_limit() -> None:
    plan = build_plan("team-a", "m", LimitSpec(rpm=600, tpm=1000), LimitSpec(rpm=60), None)
    assert plan is not None
    costs = (1, 100, 1)
    # rpm bucket of the key is empty (0.4 left), refill 10/s: 60 ms to wait for the missing 0.6
    err = refusal(plan, costs, Outcome(False, (0.4,), 0))
    assert err.status == 429
    assert err.body() == {"error": {
        "message": "Rate limit reached for requests (rpm) on key team-a: Limit 600, Used 600, Requested 1. "
                   "Please try again in 60ms.",
        "type": "requests", "param": None, "code": "rate_limit_exceeded"}}
    assert err.headers["retry-after"] == "1" and err.headers["retry-after-ms"] == "60"
    assert err.headers["x-ratelimit-limit-requests"] == "600"
    tokens = refusal(plan, costs, Outcome(False, (5.0, 10.0), 1))
    assert tokens.type == "tokens" and "tokens (tpm) on key team-a: Limit 1000, Used 990, Requested 100" in (
        tokens.message)
    assert tokens.headers["retry-after"] == "6" and tokens.headers["retry-after-ms"] == "5400"
    # the tightest requests bucket is the per-model one (5 left of 60 < 500 of 600)
    h = dict(rate_headers(plan.items, (500.0, 800.0, 5.0)))
    assert h[b"x-ratelimit-limit-requests"] == b"60" and h[b"x-ratelimit-remaining-requests"] == b"5"
    assert h[b"x-ratelimit-reset-requests"] == b"55s" and h[b"x-ratelimit-remaining-tokens"] == b"800"
    assert h[b"x-ratelimit-reset-tokens"] == b"12s"


def test_retry_after_never_exceeds_60_seconds() -> None:
    plan = build_plan("k", "m", LimitSpec(rpm=1), None, None)
    assert plan is not None
    err = refusal(plan, (1,), Outcome(False, (0.0,), 0))  # one request a minute: 60 s
    assert err.headers["retry-after"] == "60" and err.headers["retry-after-ms"] == "60000"
    plan = build_plan("k", "m", None, None, LimitSpec(tpm=10))
    assert plan is not None
    err = refusal(plan, (10,), Outcome(False, (0.0,), 0))
    assert err.headers["retry-after"] == "60" and "model m" in err.message


def test_max_parallel_refusal_and_request_too_large() -> None:
    plan = build_plan("k", "m", LimitSpec(max_parallel=2, tpm=1000, burst_tokens=500), None, None)
    assert plan is not None
    err = refusal(plan, (100, 1), Outcome(False, (400.0, 0.0), 1))
    assert err.type == "requests" and "(max_parallel) on key k: Limit 2, Used 2" in err.message
    assert too_large(plan, 500) is None
    big = too_large(plan, 501)
    assert big is not None and big.headers == {"x-should-retry": "false"}
    assert big.message.startswith("Request too large for tokens (tpm) on key k: Limit 500, Requested 501.")


@pytest.mark.parametrize(("kind", "payload", "expected"), [
    ("chat", {"max_tokens": 100}, 26 + 100),
    ("chat", {"max_completion_tokens": 7, "max_tokens": 100}, 26 + 7),
    ("chat", {}, 26 + 512),
    ("chat", {"max_tokens": 32000}, 26 + (4096 - 26)),  # capped by max_model_len
    ("chat", {"max_tokens": 10, "n": 3}, 26 + 30),
    ("completions", {"max_tokens": True}, 26 + 512),
    ("chat", {"max_tokens": 0}, 26 + 512),
    ("chat", {"max_tokens": -5, "max_completion_tokens": 1.5}, 26 + 512),
    ("chat", {"max_tokens": 10, "n": True}, 26 + 10),
    ("chat", {"max_tokens": 10, "n": 0}, 26 + 10),
    ("chat", {"max_tokens": 10, "n": "3"}, 26 + 10),
    ("responses", {"max_output_tokens": 9}, 26 + 9),
    ("embeddings", {"max_tokens": 9}, 26),
])
def test_estimate(kind: str, payload: dict[str, object], expected: int) -> None:
    assert estimate_openai(kind, payload, 100, 512, 4096) == expected


def test_usage_from_answers() -> None:
    assert usage_openai("chat", {"usage": {"prompt_tokens": 10, "completion_tokens": 6}}) == (10, 6)
    assert usage_openai("responses", {"usage": {"input_tokens": 3, "output_tokens": 4}}) == (3, 4)
    assert usage_openai("embeddings", {"usage": {"prompt_tokens": 3, "total_tokens": 3}}) == (3, 0)
    assert usage_openai("chat", {"usage": None}) is None


CHUNK = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
USAGE = (b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],'
         b'"usage":{"prompt_tokens":10,"total_tokens":14,"completion_tokens":4},"system_fingerprint":"f"}\n\n')
DONE = b"data: [DONE]\n\n"


@pytest.mark.parametrize("strip", [True, False])
def test_usage_tap_reads_and_strips_the_usage_event(strip: bool) -> None:
    tap = UsageTap("chat", strip)
    assert tap.scan(CHUNK) == CHUNK and tap.usage is None
    out = tap.scan(CHUNK + USAGE + DONE)  # the usage event between others, in one piece of output
    assert tap.usage == (10, 4)
    assert out == (CHUNK + DONE if strip else CHUNK + USAGE + DONE)
    crlf = UsageTap("chat", strip)
    assert crlf.scan(USAGE.replace(b"\n\n", b"\r\n\r\n")) == (b"" if strip else USAGE.replace(b"\n\n", b"\r\n\r\n"))
    assert crlf.usage == (10, 4)


def test_usage_tap_ignores_generated_text_that_looks_like_usage() -> None:
    text = orjson.dumps({"choices": [{"delta": {"content": '"choices":[],"usage":{'}}]})
    tap = UsageTap("chat", True)
    event = b"data: " + text + b"\n\n"
    assert tap.scan(event) == event and tap.usage is None


def test_responses_usage_from_the_completed_event() -> None:
    ev = (b'event: response.completed\ndata: {"type":"response.completed","response":{"usage":'
          b'{"input_tokens":5,"output_tokens":7}}}\n\n')
    tap = UsageTap("responses", True)
    assert tap.scan(ev) == ev and tap.usage == (5, 7)


def test_ask_for_usage() -> None:
    p: dict[str, object] = {}
    assert not ask_for_usage(p) and p["stream_options"] == {"include_usage": True}
    p = {"stream_options": {"include_usage": False, "continuous_usage_stats": True}}
    assert not ask_for_usage(p) and p["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    p = {"stream_options": {"include_usage": True}}
    assert ask_for_usage(p)
