"""Rate limits on the Anthropic routes: the same buckets, Anthropic's envelope and headers, usage counted
from the Messages API's own usage (message_start / message_delta in streams)."""

from __future__ import annotations

import re
import time

import anthropic
import pytest

from tests.fakes import FakeVLLM
from tests.integration.ratelimit_helpers import (
    KEY_A,
    StartLimited,
    freeze_clock,
    limited_config,
    metric,
    quiesce,
    start_limited,
)

__all__ = ["start_limited"]

RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
MSG = [{"role": "user", "content": "Hello"}]


def _client(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=KEY_A, max_retries=0, timeout=20)


def test_messages_carry_anthropic_ratelimit_headers_and_refusals_are_anthropic_429s(
        start_limited: StartLimited, fake: FakeVLLM) -> None:
    gw = start_limited(limited_config(fake, a={"rpm": 60, "burst_requests": 2, "tpm": 100_000}))
    freeze_clock(gw)
    with _client(gw.url) as c:
        raw = c.messages.with_raw_response.create(model="public-chat", max_tokens=4, messages=MSG)
        h = raw.headers
        assert h["anthropic-ratelimit-requests-limit"] == "60"
        assert h["anthropic-ratelimit-requests-remaining"] == "1"
        assert RFC3339.fullmatch(h["anthropic-ratelimit-requests-reset"])
        assert h["anthropic-ratelimit-tokens-limit"] == "100000"
        assert "x-ratelimit-limit-requests" not in h  # OpenAI's names only on the OpenAI routes
        assert raw.parse().model == "public-chat"
        c.messages.create(model="public-chat", max_tokens=4, messages=MSG)
        with pytest.raises(anthropic.RateLimitError) as exc:
            c.messages.create(model="public-chat", max_tokens=4, messages=MSG)
    err = exc.value
    assert err.status_code == 429
    body = err.response.json()
    assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
    assert "Rate limit reached for requests (rpm) on key team-a" in body["error"]["message"]
    assert err.response.headers["retry-after"] == "1"
    assert err.response.headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert metric(gw, "gateway_rate_limited_total", {"key": "team-a", "kind": "requests"}) == 1


def test_stream_usage_is_counted_from_message_start_and_message_delta(start_limited: StartLimited,
                                                                      fake: FakeVLLM) -> None:
    gw = start_limited(limited_config(fake, a={"tpm": 100_000}))
    with _client(gw.url) as c, c.messages.stream(model="public-chat", max_tokens=5, messages=MSG) as s:
        final = s.get_final_message()
    quiesce(gw)
    deadline = time.monotonic() + 5
    labels = {"key": "team-a", "model": "public-chat"}
    while metric(gw, "gateway_tokens_total", {**labels, "kind": "completion"}) == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert metric(gw, "gateway_tokens_total", {**labels, "kind": "prompt"}) == final.usage.input_tokens
    assert metric(gw, "gateway_tokens_total", {**labels, "kind": "completion"}) == final.usage.output_tokens == 5
