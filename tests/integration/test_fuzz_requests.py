"""Property-based fuzzing of request bodies and headers against a running gateway (fake vLLM behind).

Whatever a client sends, the gateway answers an OpenAI-format error or passes the request on: never
a 5xx of its own making (500 ``internal_error``, a traceback), never a hang. 5xx answers are allowed
only as the gateway's account of an upstream failure (``upstream_*``/``bad_upstream_response``).
Bounded: a few hundred examples in all, each one HTTP request.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.config import parse_config
from gateway.settings import Settings
from tests.fakes.plugin import fake_vllm_servers
from tests.integration.conftest import CLIENT_KEY, config_dict, upstream
from tests.support.gateway_server import GatewayServer

ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/chat/completions",
          "/v1/v1/completions/"]
UPSTREAM_CODES = {"bad_gateway", "upstream_error", "upstream_auth_failed", "upstream_model_not_found",
                  "bad_upstream_response", "upstream_unavailable", "upstream_timeout", "upstream_disconnected",
                  "upstream_connect_timeout"}
SETTINGS = settings(max_examples=120, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def gateway() -> Iterator[tuple[GatewayServer, httpx.Client]]:
    with fake_vllm_servers() as start:
        fake = start(max_model_len=2048)
        cfg = config_dict({"public-chat": [upstream(fake, name="fuzz0")]}, limits={"max_body_bytes": 65536},
                          timeouts={"first_byte": 20, "idle": 20, "total": 30})
        with GatewayServer(parse_config(yaml.safe_dump(cfg), {}), Settings(access_log=False)) as gw, \
                httpx.Client(base_url=gw.url, timeout=30) as client:
            yield gw, client


def _check(r: httpx.Response) -> None:
    assert "Traceback" not in r.text
    if r.status_code < 400:
        return
    body = r.json()
    assert set(body) == {"error"}, r.text
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, r.text
    assert isinstance(err["message"], str) and err["message"]
    assert r.status_code != 500 and err["code"] != "internal_error", r.text
    if r.status_code >= 500:
        assert err["code"] in UPSTREAM_CODES, r.text


json_scalars = st.none() | st.booleans() | st.text(max_size=20) | st.floats(allow_nan=False, allow_infinity=False) \
    | st.integers(min_value=-(2**70), max_value=2**70)
json_values = st.recursive(json_scalars, lambda kids: st.lists(kids, max_size=4)
                           | st.dictionaries(st.text(max_size=8), kids, max_size=4), max_leaves=12)
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", "x"]),
                                           "content": st.text(max_size=40) | json_values}), max_size=3)
known_fields = st.fixed_dictionaries({}, optional={
    "max_tokens": st.integers(min_value=-5, max_value=40) | json_values,
    "temperature": st.floats(min_value=-2, max_value=3) | json_values,
    "top_p": json_values, "seed": st.integers(min_value=-(2**66), max_value=2**66), "stop": json_values,
    "stream": st.booleans() | json_values, "stream_options": json_values, "logprobs": json_values,
    "user": json_values, "metadata": json_values,
})
payloads = st.builds(
    lambda model, msgs, prompt, fields: {"model": model, "messages": msgs, "prompt": prompt, "input": prompt,
                                         **fields},
    st.sampled_from(["public-chat", "public-chat", "nope", ""]) | json_values,
    messages | json_values, st.text(max_size=30) | st.lists(st.integers(0, 50), max_size=5) | json_values,
    known_fields,
)
raw_bodies = st.binary(max_size=300) | st.integers(min_value=200, max_value=1200).map(
    lambda d: b'{"model":"public-chat","messages":' + b"[" * d + b"]" * d + b"}")
header_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-0123456789", min_size=1, max_size=20)
header_values = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60).map(str.strip)
headers = st.dictionaries(header_names | st.sampled_from([
    "content-encoding", "content-type", "x-request-id", "accept", "user-agent", "x-api-key", "traceparent",
    "x-data-parallel-rank", "forwarded", "x-forwarded-for", "expect", "accept-encoding"]), header_values, max_size=8)


def _send(client: httpx.Client, route: str, body: bytes, extra: dict[str, str]) -> httpx.Response:
    h = {k: v for k, v in extra.items() if k not in ("content-length", "host", "transfer-encoding", "connection")}
    h.setdefault("content-type", "application/json")
    h["authorization"] = f"Bearer {CLIENT_KEY}"
    if h.get("expect"):
        h.pop("expect")  # a client library's business; not what is fuzzed here
    return client.post(route, content=body, headers=h)


@SETTINGS
@given(route=st.sampled_from(ROUTES), payload=payloads, extra=headers, gzipped=st.booleans())
def test_json_bodies_and_headers(gateway: tuple[GatewayServer, httpx.Client], route: str, payload: dict[str, Any],
                                 extra: dict[str, str], gzipped: bool) -> None:
    body = orjson.dumps(payload, option=orjson.OPT_NON_STR_KEYS) if _fits_orjson(payload) else \
        _dumps_stdlib(payload)
    if gzipped:
        body = gzip.compress(body)
        extra = {**extra, "content-encoding": "gzip"}
    _check(_send(gateway[1], route, body, extra))


@SETTINGS
@given(route=st.sampled_from(ROUTES), body=raw_bodies, extra=headers)
def test_raw_bodies_and_headers(gateway: tuple[GatewayServer, httpx.Client], route: str, body: bytes,
                                extra: dict[str, str]) -> None:
    _check(_send(gateway[1], route, body, extra))


def _fits_orjson(value: Any) -> bool:
    try:
        orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):
        return False
    return True


def _dumps_stdlib(value: Any) -> bytes:  # integers beyond 64 bits, which orjson cannot write
    import json

    return json.dumps(value).encode()
