"""The fake vLLM server against the bodies captured from vLLM 0.32 (../shared/vllm/captures.md,
case numbers in comments; the expected bodies are copied here), with httpx and the openai SDK."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.fakes import ENGINE_DEAD_BODY, FakeVLLM, Hang, MalformedSSE, ResetAfter, StallAfter, generated_tokens
from tests.fakes.plugin import fake_vllm_servers

KEY = "sk-backend-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
HELLO = [{"role": "user", "content": "Hello"}]
LONG = " ".join(["word"] * 1200)


@pytest.fixture
def fake() -> Iterator[FakeVLLM]:
    with fake_vllm_servers() as start:
        yield start()


@pytest.fixture
def http(fake: FakeVLLM) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fake.url, timeout=5) as client:
        yield client


@pytest.fixture
def sdk(fake: FakeVLLM) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{fake.url}/v1", api_key=KEY, max_retries=0, timeout=5) as client:
        yield client


def normalize(body: str) -> str:
    """Blank what varies between runs: ids, timestamps, generated text."""
    body = re.sub(r'"id":"(chatcmpl-|cmpl-|resp_|msg_|embd-|modelperm-)[0-9a-f]+"', r'"id":"\1X"', body)
    body = re.sub(r'"item_id":"msg_[0-9a-f]+"', '"item_id":"msg_X"', body)
    body = re.sub(r'"(created|created_at)":\d+', r'"\1":0', body)
    return re.sub(r'"(content|text|delta)":"(?:[^"\\]|\\.)+"', r'"\1":"T"', body)


def sse_data(text: str) -> list[str]:
    assert "\r" not in text
    assert text.endswith("\n\n")
    return [line.removeprefix("data: ") for line in text.split("\n\n")[:-1]]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": HELLO} | fields


# --------------------------------------------------------------------------------------------- a. health, models


def test_health_and_open_endpoints(http: httpx.Client) -> None:  # 1, 5, 6, 7
    health = http.get("/health")
    assert health.status_code == 200
    assert health.content == b""
    assert list(health.headers.keys()) == ["date", "server", "content-length", "vary"]
    assert health.headers["server"] == "uvicorn"
    assert health.headers["vary"] == "Origin"
    assert http.get("/version").content == b'{"version":"0.32.0"}'
    assert http.get("/load").content == b'{"server_load":0}'
    assert http.get("/ping").status_code == 200


def test_models_list_as_captured(http: httpx.Client) -> None:  # 3
    captured = (
        '{"object":"list","data":[{"id":"tiny","object":"model","created":1795972420,"owned_by":"vllm",'
        '"root":"./tiny-model","parent":null,"max_model_len":512,"permission":[{"id":"modelperm-9a91fbc531a9db29",'
        '"object":"model_permission","created":1795972420,"allow_create_engine":false,"allow_sampling":true,'
        '"allow_logprobs":true,"allow_search_indices":false,"allow_view":true,"allow_fine_tuning":false,'
        '"organization":"*","group":null,"is_blocking":false}]}]}'
    )
    response = http.get("/v1/models", headers=AUTH)
    assert list(response.headers.keys()) == ["date", "server", "content-length", "content-type", "vary"]
    assert normalize(response.text) == normalize(captured)


def test_metrics_gauges_are_live_and_settable(fake: FakeVLLM, http: httpx.Client) -> None:
    assert http.post("/v1/chat/completions", headers=AUTH, json=chat(max_tokens=3)).status_code == 200
    metrics = http.get("/metrics", headers={"Authorization": "Bearer sk-wrong"})
    assert metrics.headers["content-type"] == "text/plain; version=1.0.0; charset=utf-8"
    assert 'vllm:num_requests_running{engine="0",model_name="tiny"} 0.0\n' in metrics.text
    assert 'vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny"} 1.0\n' in metrics.text
    assert 'vllm:generation_tokens_total{engine="0",model_name="tiny"} 3.0\n' in metrics.text
    fake.behaviour.num_requests_running = 8
    fake.behaviour.num_requests_waiting = 6
    fake.behaviour.kv_cache_usage_perc = 0.0009766817238432424
    text = http.get("/metrics").text
    assert 'vllm:num_requests_running{engine="0",model_name="tiny"} 8.0\n' in text
    assert 'vllm:num_requests_waiting{engine="0",model_name="tiny"} 6.0\n' in text
    assert 'vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.0009766817238432424\n' in text
    assert "# TYPE vllm:kv_cache_usage_perc gauge\n" in text


# --------------------------------------------------------------------------------------------- c. auth, e. paths

UNAUTHORIZED = b'{"error":"Unauthorized"}'
NOT_FOUND = b'{"detail":"Not Found"}'


@pytest.mark.parametrize(
    ("method", "path", "headers", "status", "body"),
    [
        ("POST", "/v1/chat/completions", {"Authorization": "Bearer sk-wrong"}, 401, UNAUTHORIZED),  # 13
        ("POST", "/v1/chat/completions", {}, 401, UNAUTHORIZED),  # 14
        ("POST", "/v1/chat/completions", {"Authorization": KEY}, 401, UNAUTHORIZED),  # 15
        ("GET", "/v1/models", {"Authorization": "Bearer sk-wrong"}, 401, UNAUTHORIZED),  # 17
        ("POST", "/v1/v1/chat/completions", {}, 401, UNAUTHORIZED),  # 25
        ("POST", "/v1/embeddings", {}, 401, UNAUTHORIZED),  # 56
        ("POST", "/chat/completions", AUTH, 404, NOT_FOUND),  # 22
        ("POST", "/chat/completions", {}, 404, NOT_FOUND),  # 23
        ("POST", "/v1/v1/chat/completions", AUTH, 404, NOT_FOUND),  # 24
        ("POST", "/v1/embeddings", AUTH, 404, NOT_FOUND),  # 55
        ("GET", "/v1/chat/completions", AUTH, 405, b'{"detail":"Method Not Allowed"}'),  # 26
    ],
)
def test_auth_and_routing(
    http: httpx.Client, method: str, path: str, headers: dict[str, str], status: int, body: bytes
) -> None:
    response = http.request(method, path, headers=headers, json=chat(max_tokens=4))
    assert (response.status_code, response.content) == (status, body)
    assert response.headers["content-type"] == "application/json"
    assert ("vary" in response.headers) == (status != 401)  # the 401 comes from outside the CORS layer
    if status == 405:
        assert response.headers["allow"] == "POST"


def test_lowercase_bearer_accepted_and_keys_changeable(fake: FakeVLLM, http: httpx.Client) -> None:  # 16
    assert http.get("/v1/models", headers={"Authorization": f"bearer {KEY}"}).status_code == 200
    fake.behaviour.api_keys = ("sk-other",)
    assert http.get("/v1/models", headers=AUTH).status_code == 401
    fake.behaviour.api_keys = None
    assert http.get("/v1/models").status_code == 200


# --------------------------------------------------------------------------------------------- f. bad requests


def _error(message: str, type_: str, param: str | None, code: int = 400) -> bytes:
    return json.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}},
                      separators=(",", ":")).encode()  # fmt: skip


CONTEXT = (
    "This model's maximum context length is 512 tokens. However, your prompt contains at least 513 input tokens, "
    "which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. "
    "(parameter=input_tokens, value=513)"
)
NOPE = _error("The model `nope` does not exist. Valid aliases: tiny.", "NotFoundError", "model", 404)


@pytest.mark.parametrize(
    ("path", "content", "content_type", "expected_status", "expected"),
    [
        ("/v1/chat/completions", chat(model="nope", max_tokens=4), None, 404, NOPE),  # 19
        ("/v1/chat/completions", chat(model="nope", max_tokens=4, stream=True), None, 404, NOPE),  # 20
        ("/v1/completions", {"model": "nope", "prompt": "x", "max_tokens": 4}, None, 404, NOPE),  # 54
        ("/v1/chat/completions", chat(model="./tiny-model", max_tokens=4), None, 404,
         _error("The model `<path>` does not exist. Valid aliases: tiny.", "NotFoundError", "model", 404)),  # 21
        ("/v1/chat/completions", b'{"model":"tiny","messages":[', "application/json", 400,
         b'{"error":{"message":"1 validation error:\\n  {\'type\': \'json_invalid\', \'loc\': \'body.28\', \'msg\': '
         b'\'JSON decode error\', \'input\': \'<dict of 0 items>\', \'ctx\': {\'error\': \'Expecting value\'}}",'
         b'"type":"Bad Request","param":"body.28","code":400}}'),  # 27
        ("/v1/chat/completions", b"", "application/json", 400,
         _error("1 validation error:\n  {'type': 'missing', 'loc': 'body', 'msg': 'Field required', 'input': 'None'}",
                "Bad Request", "body")),  # 28
        ("/v1/chat/completions", json.dumps(chat(max_tokens=16)).encode(), "application/x-www-form-urlencoded", 400,
         _error("1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed",
                "Bad Request", None)),  # 29
        ("/v1/chat/completions", {"model": "tiny", "max_tokens": 4}, None, 400,
         _error("1 validation error:\n  {'type': 'missing', 'loc': 'body.messages', 'msg': 'Field required', "
                "'input': '<dict of 2 items>'}", "Bad Request", "body.messages")),  # 30
        ("/v1/chat/completions", chat(messages=[], max_tokens=4), None, 400,
         _error("Cannot apply chat template to an empty conversation. Provide at least one message.",
                "BadRequestError", None)),  # 31
        ("/v1/chat/completions", chat(messages="hi", max_tokens=4), None, 400,
         _error("1 validation error:\n  {'type': 'list_type', 'loc': 'body.messages', 'msg': "
                "'Input should be a valid list', 'input': 'hi'}", "Bad Request", "body.messages")),  # 32
        ("/v1/chat/completions", chat(max_tokens=1000), None, 400,
         _error("max_tokens=1000 cannot be greater than max_model_len=512. Please request fewer output tokens. "
                "(parameter=max_tokens, value=1000)", "BadRequestError", "max_tokens")),  # 33
        ("/v1/chat/completions", chat(messages=[{"role": "user", "content": LONG}], max_tokens=4), None, 400,
         _error(CONTEXT, "BadRequestError", "input_tokens")),  # 35
        ("/v1/chat/completions", chat(messages=[{"role": "user", "content": LONG}], stream=True), None, 400,
         _error(CONTEXT, "BadRequestError", "input_tokens")),  # 36, 37
        ("/v1/completions", {"model": "tiny", "prompt": LONG, "max_tokens": 4}, None, 400,
         _error(CONTEXT, "BadRequestError", "input_tokens")),  # 53
        ("/v1/chat/completions", chat(max_tokens=4, temperature=-1, stream=True), None, 400,
         _error("temperature must be non-negative, got -1.0. (parameter=temperature, value=-1.0)",
                "BadRequestError", "temperature")),  # 38, 39
        ("/v1/chat/completions", chat(max_tokens=4, temperature=3), None, 400,
         _error("temperature must be in [0, 2], got 3.0. (parameter=temperature, value=3.0)",
                "BadRequestError", "temperature")),  # 40
        ("/v1/chat/completions", chat(max_tokens=4, top_p=0), None, 400,
         _error("top_p must be in (0, 1], got 0.0. (parameter=top_p, value=0.0)", "BadRequestError", "top_p")),  # 41
        ("/v1/chat/completions", chat(max_tokens=0), None, 400,
         _error("max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)",
                "BadRequestError", "max_tokens")),  # 42
        ("/v1/chat/completions", chat(max_tokens=-5), None, 400,
         _error("max_tokens must be at least 1, got -5. (parameter=max_tokens, value=-5)",
                "BadRequestError", "max_tokens")),  # 43
        ("/v1/chat/completions", chat(max_tokens="abc"), None, 400,
         _error("1 validation error:\n  {'type': 'int_parsing', 'loc': 'body.max_tokens', 'msg': 'Input should be "
                "a valid integer, unable to parse string as an integer', 'input': 'abc'}",
                "Bad Request", "body.max_tokens")),  # 44
        ("/v1/chat/completions", chat(max_tokens=2, stream_options={"include_usage": True}), None, 400,
         _error("Stream options can only be defined when `stream=True`. (parameter=stream_options)",
                "BadRequestError", "stream_options")),  # 48
    ],
)  # fmt: skip
def test_bad_requests_as_captured(
    http: httpx.Client, path: str, content: Any, content_type: str | None, expected_status: int, expected: bytes
) -> None:
    if isinstance(content, bytes):
        response = http.post(path, headers=AUTH | {"Content-Type": content_type or ""}, content=content)
    else:
        response = http.post(path, headers=AUTH, json=content)
    assert response.status_code == expected_status
    assert response.content == expected
    assert list(response.headers.keys()) == ["date", "server", "content-length", "content-type", "vary"]


# --------------------------------------------------------------------------------------------- b, h. success bodies

CHAT_8 = (
    '{"id":"chatcmpl-96c095a6391172d6","object":"chat.completion","created":1795972420,"model":"tiny","choices":'
    '[{"index":0,"message":{"role":"assistant","content":"mbTestmbTestingle parser","refusal":null,"annotations":null,'
    '"audio":null,"function_call":null,"reasoning":null},"logprobs":null,"finish_reason":"length","stop_reason":null,'
    '"token_ids":null,"routed_experts":null}],"service_tier":null,"system_fingerprint":"vllm-0.32.0-db2f3ee4",'
    '"usage":{"prompt_tokens":10,"total_tokens":26,"completion_tokens":16,"prompt_tokens_details":null,'
    '"completion_tokens_details":null},"prompt_logprobs":null,"prompt_token_ids":null,"prompt_text":null,'
    '"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}'
)
COMPLETION_51 = (
    '{"id":"cmpl-907e8bfdc92297f9","object":"text_completion","created":1795972423,"model":"tiny","choices":[{"index":0,'
    '"text":"LAG member PBase hasImplemented x x","logprobs":null,"finish_reason":"length","stop_reason":null,'
    '"token_ids":null,"prompt_logprobs":null,"prompt_token_ids":null,"routed_experts":null}],"service_tier":null,'
    '"system_fingerprint":"vllm-0.32.0-db2f3ee4","usage":{"prompt_tokens":4,"total_tokens":12,"completion_tokens":8,'
    '"prompt_tokens_details":null,"completion_tokens_details":null},"kv_transfer_params":null,'
    '"ec_transfer_params":null,"metrics":null}'
)
_C = '{"id":"chatcmpl-a356747b51361132","object":"chat.completion.chunk","created":1795972420,"model":"tiny","choices":'
ROLE = _C + '[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]'
TOKEN = _C + '[{"index":0,"delta":{"content":"mb"},"logprobs":null,"finish_reason":null,"token_ids":null}]}'
LAST = _C + (
    '[{"index":0,"delta":{"content":"mb"},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null}]'
)
FP = '"system_fingerprint":"vllm-0.32.0-db2f3ee4"}'
STREAM_9 = [ROLE + ',"prompt_token_ids":null,"prompt_text":null}', TOKEN, TOKEN, TOKEN, LAST + "," + FP, "[DONE]"]
USAGE_10 = _C + '[],"usage":{"prompt_tokens":10,"total_tokens":14,"completion_tokens":4},' + FP
STREAM_10 = [*STREAM_9[:4], LAST + "}", USAGE_10, "[DONE]"]
_U = ',"usage":{"prompt_tokens":10,"total_tokens":%d,"completion_tokens":%d,"completion_tokens_details":null}'
STREAM_11 = [
    ROLE + _U % (10, 0) + ',"prompt_token_ids":null,"prompt_text":null}',
    TOKEN[:-1] + _U % (11, 1) + "}",
    TOKEN[:-1] + _U % (12, 2) + "}",
    LAST + _U % (13, 3) + "}",
    _C + '[],"usage":{"prompt_tokens":10,"total_tokens":13,"completion_tokens":3},' + FP,
    "[DONE]",
]  # fmt: skip
_P = '{"id":"cmpl-94c9de3de9a382ca","object":"text_completion","created":1795972423,"model":"tiny","choices":'
_T = (
    '[{"index":0,"text":"LAG","logprobs":null,"finish_reason":%s,"stop_reason":null,"prompt_token_ids":null,'
    '"token_ids":null}]}'
)
STREAM_52 = [
    _P + _T % "null", _P + _T % "null", _P + _T % '"length"',
    _P + '[],"usage":{"prompt_tokens":4,"total_tokens":7,"completion_tokens":3},' + FP, "[DONE]",
]  # fmt: skip


def test_chat_completion_as_captured(fake: FakeVLLM, http: httpx.Client) -> None:  # 8, 16
    response = http.post("/v1/chat/completions", headers=AUTH, json=chat(max_tokens=16, temperature=0))
    assert list(response.headers.keys()) == ["date", "server", "content-length", "content-type", "vary"]
    assert normalize(response.text) == normalize(CHAT_8)
    assert response.json()["choices"][0]["message"]["content"] == "".join(generated_tokens(16))
    assert fake.completed == 1


def test_completion_as_captured(http: httpx.Client) -> None:  # 51
    response = http.post(
        "/v1/completions", headers=AUTH, json={"model": "tiny", "prompt": "def main(", "max_tokens": 8}
    )
    assert normalize(response.text) == normalize(COMPLETION_51)


@pytest.mark.parametrize(
    ("path", "request_body", "expected"),
    [
        ("/v1/chat/completions", chat(max_tokens=4, stream=True), STREAM_9),
        ("/v1/chat/completions", chat(max_tokens=4, stream=True, stream_options={"include_usage": True}), STREAM_10),
        ("/v1/chat/completions",
         chat(max_tokens=3, stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True}),
         STREAM_11),
        ("/v1/completions",
         {"model": "tiny", "prompt": "def main(", "max_tokens": 3, "stream": True,
          "stream_options": {"include_usage": True}}, STREAM_52),
    ],
)  # fmt: skip
def test_streams_as_captured(http: httpx.Client, path: str, request_body: Any, expected: list[str]) -> None:
    with http.stream("POST", path, headers=AUTH, json=request_body) as response:
        assert list(response.headers.keys()) == ["date", "server", "content-type", "vary", "transfer-encoding"]
        assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
        text = response.read().decode()
    assert [normalize(e) for e in sse_data(text)] == [normalize(e) for e in expected]


def test_n_choices_and_clamping(http: httpx.Client) -> None:  # 34, 46, 47
    body = http.post("/v1/chat/completions", headers=AUTH, json=chat(max_tokens=4, n=2)).json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["usage"] == {"prompt_tokens": 10, "total_tokens": 18, "completion_tokens": 8,
                             "prompt_tokens_details": None, "completion_tokens_details": None}  # fmt: skip
    clamped = http.post("/v1/chat/completions", headers=AUTH, json=chat(max_tokens=505)).json()
    assert clamped["usage"]["completion_tokens"] == 502
    assert clamped["usage"]["total_tokens"] == 512

    request = chat(max_tokens=2, n=2, stream=True, stream_options={"include_usage": True})
    with http.stream("POST", "/v1/chat/completions", headers=AUTH, json=request) as response:
        events = [json.loads(e) for e in sse_data(response.read().decode())[:-1]]
    assert [e["choices"][0]["delta"] for e in events[:2]] == [{"role": "assistant", "content": ""}] * 2
    per_index: dict[int, str] = {0: "", 1: ""}
    for event in events[2:-1]:
        per_index[event["choices"][0]["index"]] += event["choices"][0]["delta"]["content"]
    assert per_index == {i: "".join(generated_tokens(2, i)) for i in (0, 1)}
    assert events[-1]["usage"] == {"prompt_tokens": 10, "total_tokens": 14, "completion_tokens": 4}


def test_each_sse_event_is_one_chunk_on_the_wire(fake: FakeVLLM) -> None:  # g (chunked framing)
    body = json.dumps(chat(max_tokens=3, stream=True)).encode()
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body
    with socket.create_connection(("127.0.0.1", fake.port), timeout=5) as sock:
        sock.sendall(request)
        wire = b""
        while data := sock.recv(65536):
            wire += data
    head, _, rest = wire.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\ndate: ")
    chunks = []
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        chunks.append(rest[:size])
        assert rest[size : size + 2] == b"\r\n"
        rest = rest[size + 2 :]
        if size == 0:
            break
    assert rest == b""
    assert chunks[-1] == b""
    assert all(c.startswith(b"data: ") and c.endswith(b"\n\n") and c.count(b"\n\n") == 1 for c in chunks[:-1])
    assert len(chunks) == 1 + 3 + 1 + 1  # role, 3 tokens, [DONE], terminator


# --------------------------------------------------------------------------------------------- the openai SDK


def test_openai_sdk_chat_and_completions(sdk: openai.OpenAI) -> None:
    reply = sdk.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hello"}], max_tokens=5)
    assert reply.choices[0].message.content == "".join(generated_tokens(5))
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == 10
    stream = sdk.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hello"}], max_completion_tokens=3,
        stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    with stream:
        chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "".join(generated_tokens(3))
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 3
    completion = sdk.completions.create(model="tiny", prompt="def main(", max_tokens=2)
    assert completion.choices[0].text == "".join(generated_tokens(2))
    assert [m.id for m in sdk.models.list()] == ["tiny"]


def test_openai_sdk_errors(fake: FakeVLLM, sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as not_found:
        sdk.chat.completions.create(model="nope", messages=[{"role": "user", "content": "Hello"}])
    assert not_found.value.body == {
        "message": "The model `nope` does not exist. Valid aliases: tiny.", "type": "NotFoundError",
        "param": "model", "code": 404,
    }  # fmt: skip
    with pytest.raises(openai.BadRequestError):
        sdk.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Hi"}], temperature=-1, stream=True
        )
    fake.behaviour.api_keys = ("sk-other",)
    with pytest.raises(openai.AuthenticationError):
        sdk.models.list()
    fake.behaviour.api_keys = (KEY,)
    fake.fail_next()
    with pytest.raises(openai.InternalServerError) as dead:
        sdk.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hello"}])
    assert dead.value.response.content == ENGINE_DEAD_BODY


def test_openai_sdk_responses(sdk: openai.OpenAI) -> None:
    response = sdk.responses.create(model="tiny", input="Hello", max_output_tokens=4)
    assert response.object == "response"
    assert response.output_text == "".join(generated_tokens(4))
    assert response.status == "incomplete"
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (10, 4)
    with sdk.responses.stream(model="tiny", input="Hello", max_output_tokens=3) as stream:
        types = [event.type for event in stream]
        final = stream.get_final_response()
    assert types[0] == "response.created"
    assert types.count("response.output_text.delta") == 3
    assert types[-1] == "response.completed"
    assert final.output_text == "".join(generated_tokens(3))


def test_openai_sdk_embeddings_model() -> None:
    with fake_vllm_servers() as start:
        fake = start(served_models=["emb"], task="embed", embedding_dim=16)
        with openai.OpenAI(base_url=f"{fake.url}/v1", api_key=KEY, max_retries=0) as sdk:
            result = sdk.embeddings.create(model="emb", input=["hello", "world"])  # base64 on the wire
            floats = sdk.embeddings.create(model="emb", input="hello", encoding_format="float")
            with pytest.raises(openai.NotFoundError):
                sdk.chat.completions.create(model="emb", messages=[{"role": "user", "content": "Hello"}])
    assert [len(d.embedding) for d in result.data] == [16, 16]
    assert result.data[0].embedding == pytest.approx(floats.data[0].embedding)
    assert result.usage.prompt_tokens == 4
    assert fake.requests_to("/v1/embeddings")[0].json["encoding_format"] == "base64"


# --------------------------------------------------------------------------------------------- behaviour knobs


def test_fail_next_then_recover(fake: FakeVLLM, http: httpx.Client) -> None:
    fake.fail_next(1)
    fake.fail_next(1, status=502, body=b"<html><body>502 Bad Gateway</body></html>", content_type="text/html")
    fake.fail_next(1, status=200, body=b"not json", content_type="text/plain")
    fake.fail_next(1, status=200, body=b'{"id":"x","object":"chat.completion"}')
    answers = [http.post("/v1/chat/completions", headers=AUTH, json=chat(max_tokens=2)) for _ in range(5)]
    assert [(a.status_code, a.headers["content-type"]) for a in answers] == [
        (500, "application/json"), (502, "text/html"), (200, "text/plain"), (200, "application/json"),
        (200, "application/json"),
    ]  # fmt: skip
    assert answers[0].content == ENGINE_DEAD_BODY
    assert "choices" not in answers[3].json()
    assert "choices" in answers[4].json()
    assert http.get("/health").status_code == 200  # faults target the generation routes by default


def test_health_503_and_fault_on_other_paths(fake: FakeVLLM, http: httpx.Client) -> None:
    fake.behaviour.health_status = 503
    response = http.get("/health")
    assert (response.status_code, response.content) == (503, b"")
    fake.inject(Hang(), paths=["/metrics"])
    with pytest.raises(httpx.ReadTimeout):
        http.get("/metrics", timeout=0.2)


def test_delays(fake: FakeVLLM, http: httpx.Client) -> None:
    fake.behaviour.first_token_delay = 0.3
    fake.behaviour.token_delay = 0.05
    started = time.monotonic()
    with http.stream("POST", "/v1/chat/completions", headers=AUTH, json=chat(max_tokens=3, stream=True)) as response:
        headers_after = time.monotonic() - started
        lines = response.iter_lines()
        first = next(line for line in lines if line)
        first_after = time.monotonic() - started
        assert sum(1 for line in lines if line) == 4  # 3 tokens and [DONE]
        total = time.monotonic() - started
    assert headers_after < 0.25  # headers go out before the first token, as in vLLM
    assert first_after >= 0.3
    assert '"role":"assistant"' in first
    assert total >= 0.3 + 2 * 0.05


def test_client_disconnect_mid_stream_aborts_generation(fake: FakeVLLM, http: httpx.Client) -> None:
    fake.behaviour.token_delay = 0.05
    with http.stream("POST", "/v1/chat/completions", headers=AUTH, json=chat(max_tokens=500, stream=True)) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
        assert fake.in_flight == 1
    assert fake.wait_for(lambda: fake.aborted == 1 and fake.in_flight == 0)
    assert fake.completed == 0


def test_hang_until_client_gives_up(fake: FakeVLLM, http: httpx.Client) -> None:
    fake.inject(Hang())
    with pytest.raises(httpx.ReadTimeout):
        http.post("/v1/chat/completions", headers=AUTH, json=chat(), timeout=0.2)
    assert fake.wait_for(lambda: fake.aborted == 1 and fake.in_flight == 0)


def test_reset_after_chunks(fake: FakeVLLM, http: httpx.Client) -> None:
    fake.inject(ResetAfter(chunks=2))
    fake.inject(ResetAfter(chunks=1, rst=False))
    for error in (httpx.ReadError, httpx.RemoteProtocolError):
        events = []
        with pytest.raises(error):
            with http.stream("POST", "/v1/chat/completions", headers=AUTH, json=chat(stream=True)) as response:
                for line in response.iter_lines():
                    events += [line] if line else []
        assert len(events) == (2 if error is httpx.ReadError else 1)
    assert fake.aborted == 0  # the server cut them: not a client disconnect


def test_stall_after_chunks(fake: FakeVLLM, http: httpx.Client) -> None:
    fake.inject(StallAfter(chunks=1))
    events = []
    with pytest.raises(httpx.ReadTimeout):
        with http.stream("POST", "/v1/chat/completions", headers=AUTH, json=chat(stream=True), timeout=0.2) as r:
            for line in r.iter_lines():
                events += [line] if line else []
    assert len(events) == 1
    assert fake.wait_for(lambda: fake.aborted == 1)


def test_malformed_sse(fake: FakeVLLM, http: httpx.Client) -> None:
    fake.inject(MalformedSSE(after=1, payload=b"data: {oops\n\n"))
    with http.stream("POST", "/v1/chat/completions", headers=AUTH, json=chat(max_tokens=2, stream=True)) as response:
        events = sse_data(response.read().decode())
    assert events[1] == "{oops"
    assert events[-1] == "[DONE]"


def test_recording(fake: FakeVLLM, http: httpx.Client) -> None:
    http.post("/v1/completions?x=1", headers=AUTH | {"X-Request-Id": "abc"}, json={"prompt": "hi"})
    http.get("/health")
    first, second = fake.requests
    assert (first.method, first.path, first.query) == ("POST", "/v1/completions", "x=1")
    assert first.headers["x-request-id"] == "abc"
    assert first.headers["authorization"] == f"Bearer {KEY}"
    assert first.json == {"prompt": "hi"}
    assert (second.method, second.path, second.json) == ("GET", "/health", None)


def test_close_and_reopen_listener(fake: FakeVLLM, http: httpx.Client) -> None:
    assert http.get("/health").status_code == 200
    fake.close_listener()
    with pytest.raises(httpx.ConnectError):
        http.get("/health")
    fake.reopen_listener()
    assert http.get("/health").status_code == 200


def test_several_fakes_stop_quickly_without_leftover_threads() -> None:
    threads_before = set(threading.enumerate())
    with fake_vllm_servers() as start:
        fakes = [start(served_models=[f"m{i}"]) for i in range(3)]
        assert len({f.port for f in fakes}) == 3
        fakes[0].inject(Hang())
        fakes[1].inject(StallAfter(chunks=2))
        clients = [httpx.Client(base_url=f.url, headers=AUTH) for f in fakes[:2]]
        waiters = [
            threading.Thread(
                target=_swallow, args=(c.post, "/v1/chat/completions"), kwargs={"json": chat(model=f"m{i}")}
            )
            for i, c in enumerate(clients)
        ]
        for waiter in waiters:
            waiter.start()
        assert fakes[0].wait_for(lambda: fakes[0].in_flight == 1)
        assert fakes[1].wait_for(lambda: fakes[1].in_flight == 1)
        started = time.monotonic()
        for fake in fakes:
            fake.stop()
        assert time.monotonic() - started < 1
    for waiter in waiters:
        waiter.join(timeout=5)
    for client in clients:
        client.close()
    assert fakes[0].aborted == 0  # stopping the fake is not a client disconnect
    assert set(threading.enumerate()) == threads_before


def _swallow(call: Any, *args: Any, **kwargs: Any) -> None:
    try:
        call(*args, **kwargs)
    except httpx.HTTPError:
        pass
