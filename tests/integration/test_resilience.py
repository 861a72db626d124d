"""Mid-stream failures, client disconnects, fail-over, readiness and metrics."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from tests.fakes import ENGINE_DEAD_BODY, FakeVLLM, Hang, MalformedSSE, ResetAfter, Respond, StallAfter
from tests.fakes.plugin import FakeVLLMFactory
from tests.integration.conftest import CLIENT_KEY, GatewayFactory, upstream
from tests.support.gateway_server import GatewayServer
from tests.support.rawhttp import post_json, read_until

MSG = [{"role": "user", "content": "Hello"}]


def _stream_all(client: openai.OpenAI, **kw: object) -> list[object]:
    return list(client.chat.completions.create(  # type: ignore[call-overload]
        model="public-chat", messages=MSG, max_tokens=8, stream=True, **kw))


@pytest.mark.parametrize("fault", [ResetAfter(chunks=3), ResetAfter(chunks=2, rst=False), ResetAfter(chunks=0)])
def test_upstream_dies_mid_stream_sdk_gets_a_clean_apierror(
    client: openai.OpenAI, fake: FakeVLLM, fault: ResetAfter
) -> None:
    fake.inject(fault)
    with pytest.raises(openai.APIError) as info:
        _stream_all(client)
    assert "fake0" in info.value.message
    assert isinstance(info.value.body, dict) and info.value.body["code"] == "upstream_disconnected"


def test_stalled_stream_hits_the_idle_timeout(start_gateway: GatewayFactory, fake: FakeVLLM) -> None:
    gw = start_gateway({"public-chat": [upstream(fake)]}, timeouts={"idle": 0.5})
    fake.inject(StallAfter(chunks=2))
    with openai.OpenAI(base_url=gw.url + "/v1", api_key=CLIENT_KEY, max_retries=0, timeout=10) as c:
        t0 = time.monotonic()
        with pytest.raises(openai.APIError) as info:
            _stream_all(c)
    assert time.monotonic() - t0 < 5
    assert isinstance(info.value.body, dict) and info.value.body["code"] == "upstream_timeout"
    assert fake.wait_for(lambda: fake.aborted == 1)  # the stalled upstream request was closed


def test_raw_stream_ends_with_error_event_then_done(http: httpx.Client, fake: FakeVLLM) -> None:
    fake.inject(ResetAfter(chunks=2))
    r = http.post("/v1/chat/completions", json={"model": "public-chat", "messages": MSG, "stream": True})
    events = r.content.split(b"\n\n")
    assert r.status_code == 200
    assert events[-3].startswith(b'data: {"error":{') and events[-2] == b"data: [DONE]"
    assert sum(1 for e in events if e.startswith(b"data: {\"error\"")) == 1


def test_malformed_sse_is_relayed_without_parsing(http: httpx.Client, fake: FakeVLLM) -> None:
    fake.inject(MalformedSSE(after=1))
    r = http.post("/v1/chat/completions", json={"model": "public-chat", "messages": MSG, "stream": True})
    assert r.status_code == 200 and r.content.endswith(b"data: [DONE]\n\n")


def test_client_disconnect_mid_stream_aborts_the_upstream(gw: GatewayServer, fake: FakeVLLM) -> None:
    fake.behaviour.token_delay = 0.05
    body = b'{"model":"public-chat","messages":[{"role":"user","content":"hi"}],"max_tokens":400,"stream":true}'
    with post_json(gw.port, "/v1/chat/completions", body, CLIENT_KEY) as s:
        read_until(s, lambda b: b.count(b"data: ") >= 3)
    assert fake.wait_for(lambda: fake.aborted == 1, timeout=3)
    assert fake.in_flight == 0 and fake.completed == 0
    metrics = httpx.get(gw.url + "/metrics").text
    assert 'gateway_client_disconnects_total{model="public-chat",route="/v1/chat/completions"} 1.0' in metrics


def test_client_giving_up_on_a_non_streaming_request_aborts_the_upstream(gw: GatewayServer, fake: FakeVLLM) -> None:
    fake.inject(Hang())
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(gw.url + "/v1/chat/completions", json={"model": "public-chat", "messages": MSG},
                   headers={"Authorization": f"Bearer {CLIENT_KEY}"}, timeout=0.5)
    assert fake.wait_for(lambda: fake.aborted == 1, timeout=3)


def test_async_sdk_stream_closed_early_aborts_upstream(gw: GatewayServer, fake: FakeVLLM) -> None:
    fake.behaviour.token_delay = 0.05

    async def go() -> None:
        async with openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=CLIENT_KEY, max_retries=0) as c:
            stream = await c.chat.completions.create(
                model="public-chat", messages=MSG, max_tokens=400, stream=True)  # type: ignore[arg-type]
            n = 0
            async for _ in stream:
                n += 1
                if n == 3:
                    break
            await stream.close()

    asyncio.run(go())
    assert fake.wait_for(lambda: fake.aborted == 1, timeout=3)


def test_failover_before_the_first_byte(start_gateway: GatewayFactory, fake_vllm: FakeVLLMFactory) -> None:
    a, b = fake_vllm(), fake_vllm()
    gw = start_gateway({"public-chat": [upstream(a, name="a"), upstream(b, name="b")]})
    with openai.OpenAI(base_url=gw.url + "/v1", api_key=CLIENT_KEY, max_retries=0) as c:
        a.inject(Respond(500, ENGINE_DEAD_BODY), times=None)
        b.inject(Respond(500, ENGINE_DEAD_BODY), times=None, paths=["/nothing"])  # b healthy
        for _ in range(4):
            r = c.chat.completions.create(model="public-chat", messages=MSG, max_tokens=2)  # type: ignore[arg-type]
            assert r.model == "public-chat"
        a.clear_faults()
        a.close_listener()  # connection refused: fail over and mark a down
        for _ in range(4):
            assert _stream_all(c)
    assert len(b.requests_to("/v1/chat/completions")) == 8
    ready = httpx.get(gw.url + "/health/ready").json()
    states = {u["name"]: u["state"] for u in ready["models"][0]["upstreams"]}
    assert states == {"a": "down", "b": "ok"} and ready["status"] == "ready"


def test_no_failover_once_the_stream_started(start_gateway: GatewayFactory, fake_vllm: FakeVLLMFactory) -> None:
    a, b = fake_vllm(), fake_vllm()
    gw = start_gateway({"public-chat": [upstream(a, name="a", weight=1), upstream(b, name="b", weight=0)]})
    a.inject(ResetAfter(chunks=2))
    with openai.OpenAI(base_url=gw.url + "/v1", api_key=CLIENT_KEY, max_retries=0) as c:
        with pytest.raises(openai.APIError):
            _stream_all(c)
    assert b.requests_to("/v1/chat/completions") == []


def test_readiness_and_metrics(start_gateway: GatewayFactory, fake_vllm: FakeVLLMFactory) -> None:
    up, down = fake_vllm(), fake_vllm()
    down.close_listener()
    gw = start_gateway({"public-chat": [upstream(up, name="up")], "other": [upstream(down, name="down")]},
                       health={"interval_s": 0.2, "timeout_s": 1})
    with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {CLIENT_KEY}"}) as c:
        assert c.get("/health").json() == {"status": "ok"}
        ready = c.get("/health/ready")
        assert ready.status_code == 200  # one dead model does not make the gateway unready
        models = {m["id"]: m for m in ready.json()["models"]}
        assert models["public-chat"]["ready"] and not models["other"]["ready"]
        assert ready.json()["models_ready"] == 1
        down.reopen_listener()
        deadline = time.monotonic() + 5  # the next scheduled probe notices
        while c.get("/health/ready").json()["models_ready"] != 2:
            assert time.monotonic() < deadline, "backend never became ready"
            time.sleep(0.05)
        c.post("/v1/chat/completions", json={"model": "public-chat", "messages": MSG})
        c.post("/v1/chat/completions", json={"model": "nope", "messages": MSG})
        up.inject(Respond(500, ENGINE_DEAD_BODY))
        c.post("/v1/chat/completions", json={"model": "public-chat", "messages": MSG})
        text = c.get("/metrics").text
    assert 'gateway_requests_total{model="public-chat",route="/v1/chat/completions",status_class="2xx"} 1.0' in text
    assert 'gateway_requests_total{model="-",route="/v1/chat/completions",status_class="4xx"} 1.0' in text
    assert 'gateway_upstream_errors_total{backend="up",kind="upstream_error"} 1.0' in text
    assert 'gateway_upstream_up{backend="down",model="other"} 1.0' in text
    assert "gateway_time_to_first_byte_seconds_bucket" in text
    assert 'gateway_requests_in_flight{route="/metrics"} 1.0' in text
    assert "nope" not in text  # labels never come from client input
