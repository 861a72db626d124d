"""TPM counted from a real vLLM's usage (chat and streamed chat): the in-memory limiter with a frozen clock,
so the bucket's level is exact."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import openai
import orjson
import pytest

from gateway.config import GatewayConfig, KeySpec, ModelSpec
from gateway.settings import Settings
from tests.support.gateway_server import GatewayServer
from tests.vllm.support import VllmServer

pytestmark = pytest.mark.vllm

KEY = "sk-real-tier-limited"
MSG = [{"role": "user", "content": "Hello"}]


@pytest.fixture
def gw(vllm_server: VllmServer) -> Iterator[GatewayServer]:
    config = GatewayConfig(
        models=[ModelSpec(id="tiny-chat", upstreams=[vllm_server.upstream(name="real-rl")])],
        keys=[KeySpec.model_validate({"name": "real-limited", "key": KEY, "tpm": 100_000, "burst_tokens": 5000})],
        health={"interval_s": 30, "timeout_s": 5},  # type: ignore[arg-type]
    )
    with GatewayServer(config, Settings(access_log=False)) as server:
        server.services.ratelimits.limiter.clock = lambda: 1_000_000.0  # no refill during the test
        yield server


def _tokens_metric(gw: GatewayServer, kind: str) -> float:
    return gw.services.metrics.registry.get_sample_value(
        "gateway_tokens_total", {"key": "real-limited", "model": "tiny-chat", "kind": kind}) or 0.0


def _settled(gw: GatewayServer) -> None:
    deadline = time.monotonic() + 30
    while gw.services.ratelimits.pending or gw.services.metrics.registry.get_sample_value(
            "gateway_requests_in_flight", {"route": "/v1/chat/completions"}):
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_tpm_counts_real_usage_for_chat_and_streamed_chat(gw: GatewayServer) -> None:
    with openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0, timeout=60) as c:
        raw = c.chat.completions.with_raw_response.create(
            model="tiny-chat", messages=MSG, max_tokens=8, temperature=0)  # type: ignore[arg-type]
        r = raw.parse()
        assert r.usage is not None and r.usage.completion_tokens == 8
        first = r.usage.prompt_tokens + r.usage.completion_tokens
        assert raw.headers["x-ratelimit-limit-tokens"] == "100000"
        _settled(gw)
        chunks = list(c.chat.completions.create(model="tiny-chat", messages=MSG, max_tokens=6,  # type: ignore[arg-type]
                                                stream=True))
        assert all(ch.usage is None for ch in chunks)  # the gateway's usage chunk is not relayed
        assert chunks[-1].choices[0].finish_reason == "length"
        _settled(gw)
    prompt = _tokens_metric(gw, "prompt")
    completion = _tokens_metric(gw, "completion")
    assert completion == 8 + 6  # vLLM's own counts, the stream's through its usage chunk
    assert prompt == 2 * r.usage.prompt_tokens
    # the bucket was charged exactly the real usage of both requests (the estimates were given back)
    body = {"model": "tiny-chat", "messages": MSG, "max_tokens": 1}
    probe = httpx.post(gw.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                       json=body, timeout=60)
    estimate = len(orjson.dumps(body)) // 4 + 1 + 1
    second = r.usage.prompt_tokens + 6
    assert probe.status_code == 200
    assert int(probe.headers["x-ratelimit-remaining-tokens"]) == 5000 - first - second - estimate
