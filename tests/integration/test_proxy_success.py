"""Happy paths through the gateway with the real openai SDK: rewriting, auth swap, headers, streaming."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from tests.fakes import FakeVLLM
from tests.fakes.plugin import FakeVLLMFactory
from tests.integration.conftest import BACKEND_KEY, CLIENT_KEY, GatewayFactory, upstream
from tests.support.gateway_server import GatewayServer
from tests.support.rawhttp import post_json, read_until

MSG = [{"role": "user", "content": "Hello"}]


def test_chat_non_streaming_rewrites_model_and_swaps_the_key(
    client: openai.OpenAI, fake: FakeVLLM
) -> None:
    r = client.chat.completions.create(model="public-chat", messages=MSG, max_tokens=4)  # type: ignore[arg-type]
    assert r.model == "public-chat"
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 4
    (sent,) = fake.requests_to("/v1/chat/completions")
    assert sent.json["model"] == "tiny"
    assert sent.headers["authorization"] == f"Bearer {BACKEND_KEY}"
    assert CLIENT_KEY not in str(sent.headers)
    assert sent.headers["x-request-id"]


def test_request_id_is_kept_echoed_and_sent_upstream(http: httpx.Client, fake: FakeVLLM) -> None:
    r = http.post("/v1/chat/completions", json={"model": "public-chat", "messages": MSG},
                  headers={"x-request-id": "req-abc.123"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "req-abc.123"
    assert fake.requests[-1].headers["x-request-id"] == "req-abc.123"
    r = http.post("/v1/chat/completions", json={"model": "public-chat", "messages": MSG},
                  headers={"x-request-id": b"bad id with spaces"})  # type: ignore[dict-item]
    assert r.headers["x-request-id"] != "bad id with spaces" and len(r.headers["x-request-id"]) == 32


def test_hop_by_hop_headers_are_dropped_allowed_ones_kept(gw: GatewayServer, fake: FakeVLLM) -> None:
    with httpx.Client(base_url=gw.url) as c:
        r = c.post("/v1/chat/completions", json={"model": "public-chat", "messages": MSG}, headers={
            "Authorization": f"Bearer {CLIENT_KEY}", "Connection": "keep-alive, x-hop", "x-hop": "1",
            "proxy-authorization": "Basic secret", "te": "trailers", "x-custom": "dropped", "cookie": "a=b",
            "user-agent": "my-app/1.0",
        })
    assert r.status_code == 200
    h = fake.requests[-1].headers
    assert h["user-agent"] == "my-app/1.0"  # on the allow-list (docs/operations.md)
    for gone in ("x-hop", "proxy-authorization", "te", "cookie", "x-custom"):
        assert gone not in h
    assert h["content-type"] == "application/json"


def test_async_client_and_completions(gw: GatewayServer, fake: FakeVLLM) -> None:
    async def go() -> None:
        async with openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=CLIENT_KEY, max_retries=0) as c:
            chat, comp = await asyncio.gather(
                c.chat.completions.create(model="public-chat", messages=MSG, max_tokens=3),  # type: ignore[arg-type]
                c.completions.create(model="public-chat", prompt="def main(", max_tokens=3),
            )
            assert chat.model == comp.model == "public-chat"
            assert comp.choices[0].text

    asyncio.run(go())
    assert {r.json["model"] for r in fake.requests if r.method == "POST"} == {"tiny"}


def test_streaming_with_include_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="public-chat", messages=MSG, max_tokens=4, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert all(c.model == "public-chat" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text


def test_stream_headers_and_framing(http: httpx.Client) -> None:
    with http.stream("POST", "/v1/completions",
                     json={"model": "public-chat", "prompt": "x", "max_tokens": 2, "stream": True}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
        assert r.headers["cache-control"] == "no-cache"
        assert r.headers["x-accel-buffering"] == "no"
        body = r.read()
    events = body.split(b"\n\n")
    assert events[-2] == b"data: [DONE]" and events[-1] == b""
    assert all(e.startswith(b"data: ") for e in events[:-1])
    assert b'"model":"public-chat"' in events[0] and b'"model":"tiny"' not in body


def test_streaming_is_incremental_over_a_real_socket(gw: GatewayServer, fake: FakeVLLM) -> None:
    """The client must see the first token long before the upstream sends its last one."""
    fake.behaviour.token_delay = 0.25
    body = b'{"model":"public-chat","messages":[{"role":"user","content":"hi"}],"max_tokens":8,"stream":true}'
    t0 = time.monotonic()
    with post_json(gw.port, "/v1/chat/completions", body, CLIENT_KEY) as s:
        seen = read_until(s, lambda b: b'"content":"' in b.split(b"\r\n\r\n", 1)[-1].replace(b'"content":""', b""))
        first_token_at = time.monotonic() - t0
        read_until(s, lambda b: b"data: [DONE]" in b, seen)
        done_at = time.monotonic() - t0
    # 8 tokens 0.25 s apart: the last arrives ~1.75 s after the first; buffering would merge them.
    assert done_at - first_token_at > 1.2


def test_embeddings_and_responses(start_gateway: GatewayFactory, fake_vllm: FakeVLLMFactory) -> None:
    embed = fake_vllm(task="embed", served_models=("emb",))
    gen = fake_vllm()
    gw = start_gateway({"public-emb": [upstream(embed, model="emb")], "public-chat": [upstream(gen)]})
    with openai.OpenAI(base_url=gw.url + "/v1", api_key=CLIENT_KEY, max_retries=0) as c:
        e = c.embeddings.create(model="public-emb", input=["a", "b"])
        assert e.model == "public-emb" and len(e.data) == 2 and e.data[0].embedding
        assert embed.requests[-1].json["model"] == "emb"
        r = c.responses.create(model="public-chat", input="Hello", max_output_tokens=4)
        assert r.model == "public-chat" and r.output_text
        events = list(c.responses.create(model="public-chat", input="Hello", max_output_tokens=3, stream=True))
        assert events[-1].type == "response.completed"
        assert events[-1].response.model == "public-chat"
        assert not any(getattr(ev, "type", "") == "error" for ev in events)


def test_models_listing_respects_key_scope(start_gateway: GatewayFactory, fake: FakeVLLM) -> None:
    gw = start_gateway({"public-chat": [upstream(fake)], "other/model-7b": [upstream(fake)]})
    with openai.OpenAI(base_url=gw.url + "/v1", api_key=CLIENT_KEY, max_retries=0) as c:
        assert sorted(m.id for m in c.models.list()) == ["other/model-7b", "public-chat"]
        assert c.models.retrieve("other/model-7b").id == "other/model-7b"
    with openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-limited-test", max_retries=0) as c:
        assert [m.id for m in c.models.list()] == ["public-chat"]
        with pytest.raises(openai.NotFoundError) as hidden:
            c.models.retrieve("other/model-7b")
        with pytest.raises(openai.NotFoundError) as unknown:
            c.models.retrieve("no-such-model")
        # a forbidden model looks exactly like an unknown one
        assert hidden.value.body == {**unknown.value.body,  # type: ignore[dict-item]
                                     "message": unknown.value.body["message"].replace(  # type: ignore[index]
                                         "no-such-model", "other/model-7b")}
        with pytest.raises(openai.NotFoundError):
            c.chat.completions.create(model="other/model-7b", messages=MSG)  # type: ignore[arg-type]


@pytest.mark.parametrize("base", ["", "/v1/v1", "/v1/"])
def test_base_url_off_by_v1_still_works(gw: GatewayServer, base: str) -> None:
    with openai.OpenAI(base_url=gw.url + base, api_key=CLIENT_KEY, max_retries=0) as c:
        r = c.chat.completions.create(model="public-chat", messages=MSG, max_tokens=2)  # type: ignore[arg-type]
        assert r.model == "public-chat"
        assert [m.id for m in c.models.list()] == ["public-chat"]


def test_environment_proxy_variables_are_ignored(
    monkeypatch: pytest.MonkeyPatch, start_gateway: GatewayFactory, fake: FakeVLLM
) -> None:
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "all_proxy"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    gw = start_gateway({"public-chat": [upstream(fake)]})
    with httpx.Client(trust_env=False) as c:
        r = c.post(gw.url + "/v1/chat/completions", json={"model": "public-chat", "messages": MSG},
                   headers={"Authorization": f"Bearer {CLIENT_KEY}"})
    assert r.status_code == 200, r.text
