"""The fake vLLM's Anthropic routes answer as vLLM 0.32 did (recorded; see tests/fakes/anthropic_api.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from tests.fakes import FakeVLLM
from tests.fakes.plugin import FakeVLLMFactory

H = {"authorization": "Bearer sk-backend-test", "anthropic-version": "2023-06-01"}
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture
def fake(fake_vllm: FakeVLLMFactory) -> FakeVLLM:
    return fake_vllm()


@pytest.fixture
def http(fake: FakeVLLM) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fake.url, headers=H, timeout=10) as c:
        yield c


def _masked(text: str) -> str:
    return re.sub(r'"chatcmpl-[0-9a-f]{16}"', '"chatcmpl-X"', re.sub(r'"text":"[^"]*"', '"text":"T"', text))


def test_create(http: httpx.Client) -> None:
    r = http.post("/v1/messages", json={"model": "tiny", "max_tokens": 8, "messages": HELLO})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert _masked(r.text) == (
        '{"id":"chatcmpl-X","type":"message","role":"assistant","content":[{"type":"text","text":"T"}],'
        '"model":"tiny","stop_reason":"max_tokens","usage":{"input_tokens":8,"output_tokens":8}}'
    )


def test_stream_framing(http: httpx.Client) -> None:
    r = http.post("/v1/messages", json={"model": "tiny", "max_tokens": 2, "stream": True, "system": "Be brief.",
                                        "messages": [{"role": "user", "content": [{"type": "text",
                                                                                    "text": "Hi there"}]}]})
    assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert _masked(r.text) == (
        'event: message_start\ndata: {"type":"message_start","message":{"id":"chatcmpl-X","type":"message",'
        '"role":"assistant","content":[],"model":"tiny","stop_reason":null,"stop_sequence":null,'
        '"usage":{"input_tokens":20,"output_tokens":0}}}\n\n'
        'event: content_block_start\ndata: {"type":"content_block_start","content_block":{"type":"text",'
        '"text":"T"},"index":0}\n\n'
        'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"type":"text_delta",'
        '"text":"T"},"index":0}\n\n'
        'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"type":"text_delta",'
        '"text":"T"},"index":0}\n\n'
        'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
        'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"max_tokens",'
        '"stop_sequence":null},"usage":{"input_tokens":20,"output_tokens":2}}\n\n'
        'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    )


def test_count_tokens(http: httpx.Client) -> None:
    r = http.post("/v1/messages/count_tokens", json={"model": "tiny", "messages": HELLO})
    assert r.text == '{"input_tokens":8,"context_management":{"original_input_tokens":8}}'


@pytest.mark.parametrize(
    ("body", "status", "text"),
    [
        ({"model": "nope", "max_tokens": 4, "messages": HELLO}, 404,
         '{"type":"error","error":{"type":"NotFoundError","message":"The model `nope` does not exist. '
         'Valid aliases: tiny."}}'),
        ({"model": "tiny", "max_tokens": 4, "messages": []}, 400,
         '{"type":"error","error":{"type":"BadRequestError","message":"Cannot apply chat template to an empty '
         'conversation. Provide at least one message."}}'),
        ({"model": "tiny", "max_tokens": 1000, "messages": HELLO}, 400,
         '{"type":"error","error":{"type":"BadRequestError","message":"max_completion_tokens=1000 cannot be '
         'greater than max_model_len=512. Please request fewer output tokens. (parameter=max_completion_tokens, '
         'value=1000)"}}'),
        ({"model": "tiny", "messages": HELLO}, 400,
         '{"error":{"message":"1 validation error:\\n  {\'type\': \'missing\', \'loc\': \'body.max_tokens\', '
         '\'msg\': \'Field required\', \'input\': \'<dict of 2 items>\'}","type":"Bad Request",'
         '"param":"body.max_tokens","code":400}}'),
        ({"model": "tiny", "max_tokens": 4, "messages": HELLO,
          "tools": [{"name": "get_weather", "description": "w", "input_schema": {"type": "object"}}]}, 400,
         '{"type":"error","error":{"type":"BadRequestError","message":"\\"auto\\" tool choice requires '
         '--enable-auto-tool-choice and --tool-call-parser to be set"}}'),
    ],
    ids=["unknown-model", "empty-messages", "max-tokens", "missing-max-tokens", "tools-without-parser"],
)
def test_errors(http: httpx.Client, body: dict[str, object], status: int, text: str) -> None:
    r = http.post("/v1/messages", json=body)
    assert (r.status_code, r.text) == (status, text)


def test_x_api_key_alone_is_not_accepted(fake: FakeVLLM) -> None:
    r = httpx.post(fake.url + "/v1/messages", json={"model": "tiny", "max_tokens": 4, "messages": HELLO},
                   headers={"x-api-key": "sk-backend-test"})
    assert (r.status_code, r.text) == (401, '{"error":"Unauthorized"}')


def test_tools_accepted_with_auto_tool_choice(fake_vllm: FakeVLLMFactory) -> None:
    fake = fake_vllm(auto_tool_choice=True)
    r = httpx.post(fake.url + "/v1/messages", headers=H, json={
        "model": "tiny", "max_tokens": 2, "messages": HELLO,
        "tools": [{"name": "t", "input_schema": {"type": "object"}}]})
    assert r.status_code == 200 and r.json()["usage"]["output_tokens"] == 2
