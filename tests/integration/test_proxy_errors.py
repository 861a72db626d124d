"""Every row of the error table, as the openai SDK and raw HTTP clients see it."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.fakes import ENGINE_DEAD_BODY, FakeVLLM, Hang, Respond
from tests.fakes.plugin import FakeVLLMFactory
from tests.integration.conftest import CLIENT_KEY, GatewayFactory, upstream
from tests.support.gateway_server import GatewayServer

MSG = [{"role": "user", "content": "Hello"}]
CHAT = {"model": "public-chat", "messages": MSG, "max_tokens": 4}


def _envelope(r: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert err["code"] is None or isinstance(err["code"], str)
    assert "Traceback" not in r.text and "detail" not in body
    if code is not None:
        assert err["code"] == code, err
    return dict(err)


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        (b'{"model":"public-chat","messages":[', None, "invalid_json"),
        (b"", None, "invalid_json"),
        (b"[1,2]", None, "invalid_json"),
        (b'{"messages":[]}', "model", "missing_required_parameter"),
        (b'{"model":"public-chat"}', "messages", "missing_required_parameter"),
        (b'{"model":"public-chat","messages":"hi"}', "messages", "invalid_type"),
        (b'{"model":7,"messages":[]}', "model", "invalid_type"),
        (b'{"model":"public-chat","messages":[],"stream":"yes"}', "stream", "invalid_type"),
    ],
)
def test_bad_request_bodies(http: httpx.Client, fake: FakeVLLM, body: bytes, param: str | None, code: str) -> None:
    r = http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    err = _envelope(r, 400, code)
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert fake.requests_to("/v1/chat/completions") == []


def test_missing_prompt_and_input(http: httpx.Client) -> None:
    _envelope(http.post("/v1/completions", json={"model": "public-chat"}), 400, "missing_required_parameter")
    _envelope(http.post("/v1/embeddings", json={"model": "public-chat"}), 400, "missing_required_parameter")


def test_missing_and_wrong_keys(gw: GatewayServer) -> None:
    with httpx.Client(base_url=gw.url) as c:
        for headers in ({}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": CLIENT_KEY},
                        {"Authorization": "Basic abc"}):
            err = _envelope(c.post("/v1/chat/completions", json=CHAT, headers=headers), 401, "invalid_api_key")
            assert CLIENT_KEY not in err["message"]
        _envelope(c.get("/v1/models"), 401, "invalid_api_key")
        assert c.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"bearer {CLIENT_KEY}"}).is_success
    with openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-wrong", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(model="public-chat", messages=MSG)  # type: ignore[arg-type]


def test_unknown_model_lists_the_keys_models(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-4", messages=MSG)  # type: ignore[arg-type]
    assert info.value.code == "model_not_found"
    assert "public-chat" in info.value.message


def test_unknown_path_and_wrong_method(http: httpx.Client) -> None:
    err = _envelope(http.post("/v1/chat/completion", json=CHAT), 404, "unknown_url")
    assert "/v1/chat/completions" in err["message"]
    _envelope(http.get("/nothing/here"), 404, "unknown_url")
    r = http.get("/v1/chat/completions")
    _envelope(r, 405, "method_not_allowed")
    assert r.headers["allow"] == "POST"


def test_body_over_the_limit(start_gateway: GatewayFactory, fake: FakeVLLM) -> None:
    gw = start_gateway({"public-chat": [upstream(fake)]}, limits={"max_body_bytes": 2048})
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}
    with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {CLIENT_KEY}"}) as c:
        _envelope(c.post("/v1/chat/completions", json=big), 413, "request_too_large")

        def chunks() -> Any:  # no content-length: the limit is enforced while reading
            yield b'{"model":"public-chat","messages":[{"role":"user","content":"'
            for _ in range(10):
                yield b"y" * 500
            yield b'"}]}'

        _envelope(c.post("/v1/chat/completions", content=chunks()), 413, "request_too_large")
    assert fake.requests_to("/v1/chat/completions") == []


def test_upstream_validation_errors_keep_status_and_message(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="public-chat", messages=MSG, temperature=-1)  # type: ignore[arg-type]
    assert info.value.status_code == 400
    assert "temperature must be non-negative" in info.value.message
    assert info.value.param == "temperature"  # type: ignore[attr-defined]
    long_prompt = [{"role": "user", "content": "word " * 600}]
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="public-chat", messages=long_prompt, stream=stream)  # type: ignore[call-overload]
        assert info.value.code == "context_length_exceeded"
        assert "maximum context length is 512 tokens" in info.value.message


def test_upstream_rejects_the_gateways_key(
    start_gateway: GatewayFactory, fake: FakeVLLM, caplog: pytest.LogCaptureFixture
) -> None:
    gw = start_gateway({"public-chat": [upstream(fake, name="gpu0", api_key="sk-drifted-backend-key")]})
    with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {CLIENT_KEY}"}) as c:
        r = c.post("/v1/chat/completions", json=CHAT)
        err = _envelope(r, 502, "upstream_auth_failed")
        assert r.headers["x-should-retry"] == "false"  # the same answer until an operator fixes it
        assert "--api-key" in err["message"] and "gpu0" in err["message"]
        assert "sk-drifted-backend-key" not in err["message"]
        ready = c.get("/health/ready")
    assert ready.status_code == 200  # the gateway itself is ready; the model is not
    assert ready.json()["models"][0]["ready"] is False
    assert ready.json()["models"][0]["upstreams"][0]["state"] == "key_mismatch"
    assert "sk-" not in ready.text
    logged = caplog.text
    assert "upstream_auth_failed" in logged or "--api-key" in logged
    assert "sk-drifted-backend-key" not in logged and CLIENT_KEY not in logged


def test_upstream_serves_another_name(
    start_gateway: GatewayFactory, fake: FakeVLLM, caplog: pytest.LogCaptureFixture
) -> None:
    gw = start_gateway({"public-chat": [upstream(fake, name="gpu0", model="/models/typo")]})
    with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {CLIENT_KEY}"}) as c:
        r = c.post("/v1/chat/completions", json=CHAT)
        err = _envelope(r, 502, "upstream_model_not_found")
        ready = c.get("/health/ready")
    assert r.headers["x-should-retry"] == "false"
    assert "gpu0" in err["message"] and "configuration error" in err["message"]
    # What the backend serves (and the configured name) is for the operator's log, not any client.
    assert "tiny" not in r.text and "/models/typo" not in r.text
    assert "tiny" not in ready.text and "/models/typo" not in ready.text
    assert "/models/typo" in caplog.text and "tiny" in caplog.text


@pytest.mark.parametrize(
    ("fault", "code"),
    [
        (Respond(500, ENGINE_DEAD_BODY), "upstream_error"),
        (Respond(502, b"<html><body><h1>502 Bad Gateway</h1></body></html>", "text/html"), "upstream_error"),
        (Respond(200, b"this is not json", "text/plain"), "bad_upstream_response"),
        (Respond(200, b'{"id":"x","object":"chat.completion"}'), "bad_upstream_response"),
    ],
)
def test_upstream_failures_become_502(http: httpx.Client, fake: FakeVLLM, fault: Respond, code: str) -> None:
    fake.inject(fault, times=None)
    err = _envelope(http.post("/v1/chat/completions", json=CHAT), 502, code)
    assert err["type"] == "server_error"


def test_upstream_failure_reaches_the_sdk_as_a_clean_error(client: openai.OpenAI, fake: FakeVLLM) -> None:
    fake.inject(Respond(200, b'{"id":"x"}'), times=None)
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="public-chat", messages=MSG)  # type: ignore[arg-type]
    assert info.value.status_code == 502


def test_unreachable_upstream_is_503(start_gateway: GatewayFactory, fake_vllm: FakeVLLMFactory) -> None:
    fake = fake_vllm()
    fake.close_listener()
    gw = start_gateway({"public-chat": [upstream(fake)]})
    with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {CLIENT_KEY}"}) as c:
        r = c.post("/v1/chat/completions", json=CHAT)
        _envelope(r, 503, "upstream_unavailable")
        ready = c.get("/health/ready")
    assert r.headers["retry-after"] == "2" and "x-should-retry" not in r.headers
    assert ready.status_code == 200 and ready.json()["models"][0]["upstreams"][0]["state"] == "down"
    assert str(fake.port) not in ready.text and "127.0.0.1" not in ready.text  # states only


def test_silent_upstream_times_out_with_504(start_gateway: GatewayFactory, fake: FakeVLLM) -> None:
    gw = start_gateway({"public-chat": [upstream(fake)]}, timeouts={"first_byte": 0.5})
    fake.inject(Hang())
    with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {CLIENT_KEY}"}, timeout=10) as c:
        r = c.post("/v1/chat/completions", json=CHAT)
        _envelope(r, 504, "upstream_timeout")
    assert r.headers["x-should-retry"] == "false"
    assert len(fake.requests_to("/v1/chat/completions")) == 1  # a timeout is never retried


def test_unknown_upstream_4xx_keeps_its_status(http: httpx.Client, fake: FakeVLLM) -> None:
    fake.inject(Respond(422, b'{"detail":[{"loc":["body","x"],"msg":"bad"}]}'))
    err = _envelope(http.post("/v1/chat/completions", json=CHAT), 422)
    assert "422" in err["message"]
    # A backend's 429 is retried (retry.max_attempts, 3 by default); when every attempt gets it, it is kept.
    before = len(fake.requests_to("/v1/chat/completions"))
    fake.inject(Respond(429, b'{"error":{"message":"slow down","type":"RateLimit","param":null,"code":429}}'),
                times=3)
    err = _envelope(http.post("/v1/chat/completions", json=CHAT), 429, "rate_limit_exceeded")
    assert err["message"] == "slow down"
    assert len(fake.requests_to("/v1/chat/completions")) == before + 3


@pytest.mark.parametrize("chunked", [False, True])
def test_answer_over_max_response_bytes_is_a_502_not_relayed(
    start_gateway: GatewayFactory, fake: FakeVLLM, chunked: bool
) -> None:
    gw = start_gateway({"public-chat": [upstream(fake)]}, limits={"max_response_bytes": 1024})
    big = b'{"id":"x","object":"chat.completion","choices":[],"pad":"' + b"a" * 2000 + b'"}'
    fake.inject(Respond(200, [big[:700], big[700:1400], big[1400:]] if chunked else big))
    with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {CLIENT_KEY}"}, timeout=10) as c:
        r = c.post("/v1/chat/completions", json=CHAT)
        err = _envelope(r, 502, "bad_upstream_response")
        assert "over 1024 bytes" in err["message"] and b"aaaa" not in r.content
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200  # the next one is served
