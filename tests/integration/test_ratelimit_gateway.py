"""Rate limits through the gateway (in-memory limiter, injected clock): 429 bodies and headers, refill,
token reconciliation for streams and non-streams, max_parallel release, per_model and model-wide limits."""

from __future__ import annotations

import re
import time

import httpx
import openai
import orjson
import pytest

from tests.fakes import FakeVLLM, ResetAfter
from tests.integration.ratelimit_helpers import (
    CHAT,
    FREE,
    KEY_A,
    KEY_B,
    MSG,
    StartLimited,
    freeze_clock,
    limited_config,
    metric,
    quiesce,
    start_limited,
)
from tests.support.rawhttp import post_json, read_until

__all__ = ["start_limited"]

BODY_RE = re.compile(
    r"Rate limit reached for requests \(rpm\) on key team-a: Limit 60, Used 2, Requested 1\. "
    r"Please try again in (\d+(\.\d+)?m?s)\.")


def post(gw_url: str, key: str, **extra: object) -> httpx.Response:
    body = {"model": "public-chat", "messages": MSG, "max_tokens": 4, **extra}
    return httpx.post(gw_url + CHAT, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=20)


def test_rpm_bucket_refuses_with_openai_body_and_headers_then_refills(start_limited: StartLimited,
                                                                       fake: FakeVLLM) -> None:
    gw = start_limited(limited_config(fake, a={"rpm": 60, "burst_requests": 2}))
    now = freeze_clock(gw)
    ok1, ok2 = post(gw.url, KEY_A), post(gw.url, KEY_A)
    assert ok1.status_code == ok2.status_code == 200
    assert ok1.headers["x-ratelimit-limit-requests"] == "60"
    assert (ok1.headers["x-ratelimit-remaining-requests"], ok2.headers["x-ratelimit-remaining-requests"]) == ("1", "0")
    assert ok2.headers["x-ratelimit-reset-requests"] == "2s"
    assert "x-ratelimit-limit-tokens" not in ok1.headers  # no tpm configured
    r = post(gw.url, KEY_A)
    assert r.status_code == 429
    assert r.json() == {"error": {"message": r.json()["error"]["message"], "type": "requests", "param": None,
                                  "code": "rate_limit_exceeded"}}
    assert BODY_RE.fullmatch(r.json()["error"]["message"]), r.json()
    assert r.headers["retry-after"] == "1" and r.headers["retry-after-ms"] == "1000"
    assert r.headers["x-ratelimit-remaining-requests"] == "0" and "x-should-retry" not in r.headers
    assert len(fake.requests_to(CHAT)) == 2  # the refused request never reached the backend
    assert post(gw.url, FREE).status_code == 200  # a key without limits is not affected
    assert "x-ratelimit-limit-requests" not in post(gw.url, FREE).headers
    now[0] += 999
    assert post(gw.url, KEY_A).status_code == 429
    now[0] += 1
    assert post(gw.url, KEY_A).status_code == 200
    assert metric(gw, "gateway_rate_limited_total", {"key": "team-a", "kind": "requests"}) == 2


def _remaining_tokens(gw_url: str) -> int:
    r = post(gw_url, KEY_A)
    assert r.status_code == 200
    return int(r.headers["x-ratelimit-remaining-tokens"])


def _estimate(**extra: object) -> int:
    body = orjson.dumps({"model": "public-chat", "messages": MSG, "max_tokens": 4, **extra})
    return len(body) // 4 + 1 + 4


def test_tpm_reconciled_with_the_real_usage_non_streaming(start_limited: StartLimited, fake: FakeVLLM) -> None:
    gw = start_limited(limited_config(fake, a={"tpm": 10_000}))
    freeze_clock(gw)
    e = _estimate()
    r = post(gw.url, KEY_A)
    assert r.status_code == 200 and r.headers["x-ratelimit-limit-tokens"] == "10000"
    assert int(r.headers["x-ratelimit-remaining-tokens"]) == 10_000 - e  # the estimate, taken up front
    assert r.json()["usage"]["total_tokens"] == 14  # fake vLLM: prompt 10 + 4 generated
    quiesce(gw)
    assert _remaining_tokens(gw.url) == 10_000 - 14 - e  # the first one now costs its real 14 tokens
    quiesce(gw)
    labels = {"key": "team-a", "model": "public-chat"}
    assert metric(gw, "gateway_tokens_total", {**labels, "kind": "prompt"}) == 20
    assert metric(gw, "gateway_tokens_total", {**labels, "kind": "completion"}) == 8


def _stream(gw_url: str, key: str, **extra: object) -> bytes:
    body = {"model": "public-chat", "messages": MSG, "max_tokens": 4, "stream": True, **extra}
    with httpx.stream("POST", gw_url + CHAT, json=body, headers={"Authorization": f"Bearer {key}"},
                      timeout=20) as r:
        assert r.status_code == 200
        assert "x-ratelimit-remaining-tokens" in r.headers or key == FREE
        return r.read()


@pytest.mark.parametrize("client_asks", [False, True])
def test_tpm_reconciled_for_streams_and_usage_chunk_only_when_asked(
        start_limited: StartLimited, fake: FakeVLLM, client_asks: bool) -> None:
    gw = start_limited(limited_config(fake, a={"tpm": 10_000}))
    freeze_clock(gw)
    extra: dict[str, object] = {"stream_options": {"include_usage": True}} if client_asks else {}
    raw = _stream(gw.url, KEY_A, **extra)
    assert fake.requests_to(CHAT)[-1].json["stream_options"] == {"include_usage": True}  # always asked upstream
    events = [e for e in raw.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    has_usage = b'"choices":[],"usage":' in raw
    assert has_usage == client_asks
    assert len(events) == 1 + 4 + 1 + (1 if client_asks else 0)  # role, 4 tokens, DONE (+ usage)
    quiesce(gw)
    e2 = _estimate()
    assert _remaining_tokens(gw.url) == 10_000 - 14 - e2


def test_free_key_stream_is_relayed_without_the_gateways_usage_chunk(start_limited: StartLimited,
                                                                    fake: FakeVLLM) -> None:
    gw = start_limited(limited_config(fake))
    raw = _stream(gw.url, FREE)
    assert b'"usage"' not in raw and raw.endswith(b"data: [DONE]\n\n")
    quiesce(gw)
    assert metric(gw, "gateway_tokens_total", {"key": "free", "model": "public-chat", "kind": "completion"}) == 4


def test_a_stream_cut_short_keeps_the_estimate(start_limited: StartLimited, fake: FakeVLLM) -> None:
    gw = start_limited(limited_config(fake, a={"tpm": 10_000}))
    freeze_clock(gw)
    fake.inject(ResetAfter(chunks=2))
    body = {"model": "public-chat", "messages": MSG, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", gw.url + CHAT, json=body, headers={"Authorization": f"Bearer {KEY_A}"}) as r:
        assert b"upstream_disconnected" in r.read()
    quiesce(gw)
    e1 = len(orjson.dumps(body)) // 4 + 1 + 4
    assert _remaining_tokens(gw.url) == 10_000 - e1 - _estimate()


def _open_stream(gw: object, key: str):  # type: ignore[no-untyped-def]
    body = orjson.dumps({"model": "public-chat", "messages": MSG, "max_tokens": 40, "stream": True})
    return post_json(gw.port, CHAT, body, key)  # type: ignore[attr-defined]


@pytest.mark.parametrize("ending", ["ends", "fails", "client_disconnects"])
def test_max_parallel_slot_is_released_when_the_stream_ends(start_limited: StartLimited, fake: FakeVLLM,
                                                             ending: str) -> None:
    gw = start_limited(limited_config(fake, a={"max_parallel": 1}))
    fake.behaviour.token_delay = 0.05  # ~2 s of stream: still open when the second request comes, even on a busy VM
    if ending == "fails":
        fake.inject(ResetAfter(chunks=30))
    with _open_stream(gw, KEY_A) as s:
        seen = read_until(s, lambda b: b.count(b"data: ") >= 2)
        r = post(gw.url, KEY_A)
        assert r.status_code == 429 and r.json()["error"]["type"] == "requests"
        assert "(max_parallel) on key team-a: Limit 1, Used 1, Requested 1" in r.json()["error"]["message"]
        assert r.headers["retry-after"] == "1"
        if ending != "client_disconnects":
            seen = read_until(s, lambda b: b.endswith(b"0\r\n\r\n"), seen)
            assert seen.count(b"data: [DONE]") == 1
    quiesce(gw)
    assert post(gw.url, KEY_A).status_code == 200
    assert metric(gw, "gateway_rate_limited_total", {"key": "team-a", "kind": "parallel"}) == 1


def test_per_model_and_model_wide_limits_together(start_limited: StartLimited, fake: FakeVLLM) -> None:
    gw = start_limited(limited_config(
        fake, a={"rpm": 100, "per_model": {"public-chat": {"rpm": 1, "burst_requests": 2}}},
        model={"rpm": 1, "burst_requests": 3}))
    freeze_clock(gw)
    assert [post(gw.url, KEY_A).status_code for _ in range(2)] == [200, 200]
    r = post(gw.url, KEY_A)
    assert r.status_code == 429
    assert "on key team-a for model public-chat: Limit 1, Used 2, Requested 1" in r.json()["error"]["message"]
    # team-b has no limits of its own, but shares the model-wide bucket (3): one left
    assert [post(gw.url, KEY_B).status_code for _ in range(2)] == [200, 429]
    r = post(gw.url, KEY_B)
    assert "on model public-chat: Limit 1, Used 3, Requested 1" in r.json()["error"]["message"]
    assert r.headers["retry-after"] == "60" and r.headers["retry-after-ms"] == "60000"


def test_request_that_can_never_fit_is_not_retried(start_limited: StartLimited, fake: FakeVLLM) -> None:
    gw = start_limited(limited_config(fake, a={"tpm": 1000, "burst_tokens": 200}))
    r = post(gw.url, KEY_A, max_tokens=300)
    assert r.status_code == 429 and r.headers["x-should-retry"] == "false"
    assert r.json()["error"]["message"].startswith("Request too large for tokens (tpm) on key team-a: Limit 200, ")
    assert post(gw.url, KEY_A).status_code == 200
    bad = httpx.post(gw.url + CHAT, json={"model": "public-chat"}, headers={"Authorization": f"Bearer {KEY_A}"})
    assert bad.status_code == 400 and bad.headers["x-should-retry"] == "false"


def test_max_tokens_far_above_the_context_is_capped_by_max_model_len(start_limited: StartLimited,
                                                                      fake: FakeVLLM) -> None:
    cfg = limited_config(fake, a={"tpm": 2000})
    cfg["models"][0]["upstreams"][0]["launch"] = {"model_path": "/m", "max_model_len": 512}
    gw = start_limited(cfg)
    # Claude Code style: max_tokens 32000 on every turn; the estimate is capped at 512 - prompt
    freeze_clock(gw)
    r = post(gw.url, KEY_A, max_tokens=32000)
    assert r.status_code == 400  # the fake (max_model_len 512) rejects 32000 itself
    assert int(r.headers["x-ratelimit-remaining-tokens"]) == 2000 - 512
    quiesce(gw)  # a request the backend refused generated nothing: the whole estimate comes back
    assert _remaining_tokens(gw.url) == 2000 - _estimate()


def test_openai_sdk_gets_rate_limit_error_and_succeeds_with_retries_after_refill(
        start_limited: StartLimited, fake: FakeVLLM) -> None:
    gw = start_limited(limited_config(fake, a={"rpm": 60, "burst_requests": 1}))
    with openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY_A, max_retries=0, timeout=20) as c:
        c.chat.completions.create(model="public-chat", messages=MSG, max_tokens=2)  # type: ignore[arg-type]
        with pytest.raises(openai.RateLimitError) as info:
            c.chat.completions.create(model="public-chat", messages=MSG, max_tokens=2)  # type: ignore[arg-type]
        assert info.value.code == "rate_limit_exceeded" and info.value.type == "requests"
    t0 = time.monotonic()
    with openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY_A, timeout=20) as c:  # default: 2 retries
        r = c.chat.completions.create(model="public-chat", messages=MSG, max_tokens=2)  # type: ignore[arg-type]
    assert r.choices[0].finish_reason == "length"
    assert time.monotonic() - t0 >= 0.2  # it waited for the bucket (retry-after-ms), then got through
    assert metric(gw, "gateway_rate_limited_total", {"key": "team-a", "kind": "requests"}) >= 2
