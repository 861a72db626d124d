"""Pure parts of `gateway loadtest`: durations, percentiles, URL forms, answer readers, verdict, SVG."""

from __future__ import annotations

import argparse

import pytest

from gateway.loadtool.cli import parse_duration, prompt_of
from gateway.loadtool.client import RequestResult, Target, normalise_base_url
from gateway.loadtool.html import Series, histogram_svg, timeline_svg
from gateway.loadtool.protocol import Answer, AnthropicMessages, Failure, OpenAIChat, error_failure
from gateway.loadtool.runner import Plan
from gateway.loadtool.stats import Criteria, judge, percentile, summarize


@pytest.mark.parametrize(("text", "seconds"), [("60s", 60), ("2m", 120), ("500ms", 0.5), ("1h", 3600), ("1.5", 1.5)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "-1s", "0s", "5 weeks"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration(text)


def test_percentile_interpolates_like_numpy() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    assert percentile(values, 0.5) == pytest.approx(5.5)
    assert percentile(values, 0.9) == pytest.approx(9.1)
    assert percentile(values, 0.99) == pytest.approx(9.91)
    assert percentile([3.0], 0.99) == 3.0


@pytest.mark.parametrize("url", ["http://h:8080", "http://h:8080/", "http://h:8080/v1", " http://h:8080/v1/ "])
def test_base_url_forms(url: str) -> None:
    assert normalise_base_url(url) == "http://h:8080"


def test_openai_stream_ttft_skips_the_role_chunk_and_reads_usage() -> None:
    api, answer = OpenAIChat(), Answer()
    api.read_event("message", '{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}', answer)
    assert not answer.first_token
    api.read_event("message", '{"choices":[{"index":0,"delta":{"content":"mb"}}]}', answer)
    assert answer.first_token and answer.output_tokens is None
    api.read_event("message", '{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":4}}', answer)
    api.read_event("message", "[DONE]", answer)
    assert answer.output_tokens == 4 and answer.done


def test_openai_in_band_error_and_bad_event() -> None:
    api = OpenAIChat()
    with pytest.raises(Failure) as info:
        api.read_event("message", '{"error":{"message":"boom","type":"x","param":null,"code":"upstream_error"}}',
                       Answer())
    assert (info.value.kind, info.value.message) == ("stream error upstream_error", "boom")
    with pytest.raises(Failure) as info:
        api.read_event("message", '{"id":"x","choices":[{"delta":', Answer())
    assert info.value.kind == "bad_response"
    with pytest.raises(Failure, match="no choices"):
        api.read_body(b'{"object":"list"}')


def test_anthropic_reader() -> None:
    api, answer = AnthropicMessages(), Answer()
    api.read_event("message_start", '{"type":"message_start","message":{"usage":{"input_tokens":3,'
                   '"output_tokens":1}}}', answer)
    api.read_event("content_block_delta", '{"type":"content_block_delta","delta":{"type":"text_delta","text":"a"}}',
                   answer)
    api.read_event("message_delta", '{"type":"message_delta","usage":{"output_tokens":9}}', answer)
    assert not answer.done
    api.read_event("message_stop", '{"type":"message_stop"}', answer)
    assert answer.first_token and answer.done and answer.output_tokens == 9
    assert api.read_body(b'{"type":"message","usage":{"output_tokens":2}}').output_tokens == 2


def test_error_bodies_group_by_status_and_code() -> None:
    body = b'{"error":{"message":"nope","type":"NotFoundError","param":"model","code":"model_not_found"}}'
    f = error_failure(404, body)
    assert (f.kind, f.message) == ("HTTP 404 model_not_found", "nope")
    assert error_failure(500, b"").message == "(empty body)"
    assert error_failure(401, b'{"error":"Unauthorized"}').kind == "HTTP 401"


def _result(ok: bool, latency: float, tokens: int | None = 4) -> RequestResult:
    return RequestResult(0, 0.0, latency, None, 200 if ok else 503, tokens if ok else None,
                         None if ok else "HTTP 503", None if ok else "down")


def test_verdict_edges() -> None:
    target = Target("t", "http://h", "k", "m")
    s = summarize(target, [_result(True, 1.0)] * 19 + [_result(False, 0.1)], active_s=2.0)
    assert s.success_rate == 0.95 and s.requests_per_s == 10 and s.output_tokens_per_s == 38
    assert judge(s, Criteria(0.95, 1.0)).passed  # both bounds are inclusive
    v = judge(s, Criteria(0.96, 0.5))
    assert not v.passed and len(v.reasons) == 2
    assert judge(summarize(target, [], 0.0), Criteria()).reasons == ["no request completed"]


def test_plan_needs_exactly_one_bound() -> None:
    with pytest.raises(ValueError):
        Plan(concurrency=1)
    with pytest.raises(ValueError):
        Plan(concurrency=1, requests=1, duration_s=1)
    assert Plan(concurrency=16, requests=64).rounds_of() == 16
    assert Plan(concurrency=4, requests=1000).rounds_of() == 125


def test_svg_charts() -> None:
    svg = histogram_svg("L", [Series("a", "#000", [0.1, 0.2, 0.2, 0.3]), Series("b", "#111", [])])
    assert svg.startswith("<svg") and svg.count("<rect") >= 3 + 2  # bars + legend swatches
    assert "no data" in histogram_svg("T", [Series("a", "#000", [])])
    line = timeline_svg("R", [Series("ok", "#000", [0.1, 0.5, 1.5])], duration_s=2.0)
    assert line.count("<polyline") == 1


def test_prompt_of_has_the_asked_number_of_words() -> None:
    assert len(prompt_of(100).split()) == 100
