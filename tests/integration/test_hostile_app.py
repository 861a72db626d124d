"""A careless or hostile client against the gateway on real uvicorn (fake vLLM behind it): every answer
is the right OpenAI-format error, nothing leaks, nothing is blamed on a healthy backend (issue 6)."""

from __future__ import annotations

import gzip
import logging
import socket
import zlib
from typing import Any

import httpx
import openai
import orjson
import pytest

from gateway.observability.logging import JsonFormatter, TextFormatter
from tests.fakes import FakeVLLM, Hang, Respond
from tests.fakes.plugin import FakeVLLMFactory
from tests.integration.conftest import CLIENT_KEY, GatewayFactory, upstream
from tests.support.gateway_server import GatewayServer
from tests.support.rawhttp import read_until

MSG = [{"role": "user", "content": "Hello"}]
CHAT = {"model": "public-chat", "messages": MSG, "max_tokens": 4}
AUTH = {"Authorization": f"Bearer {CLIENT_KEY}"}


def _error(r: httpx.Response, status: int, code: str | None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == code, body
    assert "Traceback" not in r.text
    return dict(body["error"])


# ---------------------------------------------------------------- 3. deep nesting, 7. big integers
@pytest.mark.parametrize("depth", [254, 300, 1023, 1024, 1100])  # + the top object: 255 levels and more
def test_deep_nesting_is_the_clients_400(http: httpx.Client, fake: FakeVLLM, depth: int) -> None:
    body = b'{"model":"public-chat","messages":[],"metadata":' + b"[" * depth + b"]" * depth + b"}"
    err = _error(http.post("/v1/chat/completions", content=body), 400, "invalid_json")
    assert "nested too deeply" in err["message"] or "depth" in err["message"]
    assert fake.requests_to("/v1/chat/completions") == []


def test_nesting_the_gateway_can_write_is_passed_on(http: httpx.Client, fake: FakeVLLM) -> None:
    nested = b"[" * 200 + b"]" * 200
    body = b'{"model":"public-chat","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"vllm_xargs":' \
        + nested + b"}"
    r = http.post("/v1/chat/completions", content=body)
    assert r.status_code == 200, r.text
    assert nested in fake.requests_to("/v1/chat/completions")[-1].body


def test_integers_beyond_64_bits_are_refused_not_rounded(http: httpx.Client, fake: FakeVLLM) -> None:
    for literal in (b"18446744073709551616", b"-9223372036854775809", b"1" * 400):
        body = b'{"model":"public-chat","messages":[{"role":"user","content":"hi"}],"seed":' + literal + b"}"
        err = _error(http.post("/v1/chat/completions", content=body), 400, "invalid_json")
        assert "out of range" in err["message"] or "infinity" in err["message"]
    assert fake.requests_to("/v1/chat/completions") == []
    # Within range: exactly as sent, also at the edges; long digit runs inside strings are text.
    body = (b'{"model":"public-chat","messages":[{"role":"user","content":"12345678901234567890123"}],'
            b'"max_tokens":2,"seed":18446744073709551615,"user":"-92233720368547758090"}')
    assert http.post("/v1/chat/completions", content=body).status_code == 200
    sent = fake.requests_to("/v1/chat/completions")[-1]
    assert b'"seed":18446744073709551615' in sent.body
    assert sent.json["messages"][0]["content"] == "12345678901234567890123"


# ---------------------------------------------------------------- 4. the SDK's retries
def test_sdk_default_retries_run_a_timed_out_generation_once(start_gateway: GatewayFactory, fake: FakeVLLM) -> None:
    gw = start_gateway({"public-chat": [upstream(fake)]}, timeouts={"first_byte": 0.5})
    fake.inject(Hang(), times=None)
    with openai.OpenAI(base_url=gw.url + "/v1", api_key=CLIENT_KEY, timeout=30) as client:  # default max_retries
        assert client.max_retries == 2
        with pytest.raises(openai.InternalServerError) as info:
            client.chat.completions.create(model="public-chat", messages=MSG)  # type: ignore[arg-type]
    assert info.value.status_code == 504
    assert info.value.response.headers["x-should-retry"] == "false"
    assert len(fake.requests_to("/v1/chat/completions")) == 1  # one generation on the GPU, not three


@pytest.mark.parametrize(
    ("fault", "status", "code"),
    [
        (Respond(401, b'{"error":"Unauthorized"}'), 502, "upstream_auth_failed"),
        (Respond(404, b'{"error":{"message":"The model `tiny` does not exist.","type":"NotFoundError",'
                      b'"param":"model","code":404}}'), 502, "upstream_model_not_found"),
        (Respond(200, b'{"id":"x","object":"chat.completion"}'), 502, "bad_upstream_response"),
        (Respond(200, b"<html>not json</html>", "text/html"), 502, "bad_upstream_response"),
    ],
)
def test_sdk_does_not_repeat_permanent_502s(
    gw: GatewayServer, fake: FakeVLLM, fault: Respond, status: int, code: str
) -> None:
    fake.inject(fault, times=None)
    with openai.OpenAI(base_url=gw.url + "/v1", api_key=CLIENT_KEY, timeout=30) as client:
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(model="public-chat", messages=MSG)  # type: ignore[arg-type]
    assert info.value.status_code == status and info.value.code == code
    assert len(fake.requests_to("/v1/chat/completions")) == 1


def test_unavailable_backend_says_when_to_retry(start_gateway: GatewayFactory, fake_vllm: FakeVLLMFactory) -> None:
    dead = fake_vllm()
    dead.close_listener()
    gw = start_gateway({"public-chat": [upstream(dead)]})
    r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=AUTH)
    _error(r, 503, "upstream_unavailable")
    assert int(r.headers["retry-after"]) >= 1 and "x-should-retry" not in r.headers


# ---------------------------------------------------------------- 5. a route the model's backend lacks
def test_embeddings_on_a_generation_model_is_a_4xx_naming_model_and_route(
    gw: GatewayServer, fake: FakeVLLM
) -> None:
    with openai.OpenAI(base_url=gw.url + "/v1", api_key=CLIENT_KEY, timeout=30) as client:
        with pytest.raises(openai.BadRequestError) as info:
            client.embeddings.create(model="public-chat", input="hi")
    assert info.value.code == "unsupported_endpoint" and info.value.param == "model"  # type: ignore[attr-defined]
    assert "public-chat" in info.value.message and "/v1/embeddings" in info.value.message
    assert len(fake.requests_to("/v1/embeddings")) == 1  # not retried by the SDK
    text = httpx.get(gw.url + "/metrics").text
    assert 'gateway_upstream_errors_total{backend="fake0"' not in text


def test_generation_on_an_embedding_model(start_gateway: GatewayFactory, fake_vllm: FakeVLLMFactory) -> None:
    emb = fake_vllm(task="embed", served_models=("emb",))
    gw = start_gateway({"embedder": [upstream(emb, model="emb")]})
    r = httpx.post(gw.url + "/v1/chat/completions", headers=AUTH,
                   json={"model": "embedder", "messages": MSG})
    err = _error(r, 400, "unsupported_endpoint")
    assert "embedder" in err["message"] and "/v1/chat/completions" in err["message"]
    assert r.headers["x-should-retry"] == "false"


# ---------------------------------------------------------------- 7. HEAD, WWW-Authenticate, paths
@pytest.mark.parametrize("path", ["/health", "/health/ready", "/v1/models", "/v1/models/public-chat", "/metrics"])
def test_head_works_where_get_does(gw: GatewayServer, path: str) -> None:
    get = httpx.get(gw.url + path, headers=AUTH)
    head = httpx.head(gw.url + path, headers=AUTH)
    assert get.status_code == 200 and head.status_code == 200, head.text
    assert head.content == b"" and head.headers["content-type"] == get.headers["content-type"]


def test_401_names_the_scheme(gw: GatewayServer) -> None:
    for r in (httpx.get(gw.url + "/v1/models"), httpx.get(gw.url + "/v1/models/public-chat"),
              httpx.post(gw.url + "/v1/chat/completions", json=CHAT),
              httpx.get(gw.url + "/v1/models", headers={"Authorization": "Bearer sk-wrong"})):
        _error(r, 401, "invalid_api_key")
        assert r.headers["www-authenticate"].startswith("Bearer")


# ---------------------------------------------------------------- 8. headers as the backend sees them
def test_only_allowed_client_headers_reach_the_backend(gw: GatewayServer, fake: FakeVLLM) -> None:
    hostile = {
        "x-api-key": "sk-client-secret-1", "api-key": "sk-client-secret-2", "x-forwarded-for": "10.0.0.1",
        "forwarded": "for=10.0.0.1", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "x-data-parallel-rank": "3", "cookie": "session=abc", "x-stainless-lang": "python",
        "user-agent": "careful-client/1.0", "accept": "application/json", "x-custom": "y",
        **{f"x-flood-{i}": "v" * 100 for i in range(200)},
    }
    r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers={**AUTH, **hostile})
    assert r.status_code == 200, r.text
    seen = fake.requests_to("/v1/chat/completions")[-1].headers
    assert set(seen) <= {"host", "content-length", "content-type", "accept-encoding", "x-request-id",
                         "authorization", "user-agent", "accept"}, sorted(seen)
    assert seen["user-agent"] == "careful-client/1.0" and seen["accept"] == "application/json"
    assert seen["authorization"] == "Bearer sk-backend-test"
    assert "sk-client" not in str(seen) and CLIENT_KEY not in str(seen)


def test_tracing_headers_pass_when_configured(start_gateway: GatewayFactory, fake: FakeVLLM) -> None:
    gw = start_gateway({"public-chat": [upstream(fake)]},
                       forward_headers={"allow": ["user-agent", "traceparent", "tracestate"]})
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT,
                   headers={**AUTH, "traceparent": tp, "tracestate": "a=b", "accept": "x/y", "x-api-key": "k"})
    assert r.status_code == 200
    seen = fake.requests_to("/v1/chat/completions")[-1].headers
    assert seen["traceparent"] == tp and seen["tracestate"] == "a=b"
    assert "accept" not in seen and "x-api-key" not in seen


def test_config_refuses_forwarding_the_gateways_own_headers(start_gateway: GatewayFactory, fake: FakeVLLM) -> None:
    for name in ("authorization", "x-api-key", "content-encoding", "x-forwarded-for", "x-data-parallel-rank"):
        with pytest.raises(Exception, match="never forwarded"):
            start_gateway({"public-chat": [upstream(fake)]}, forward_headers={"allow": [name]})


def test_compressed_request_bodies(start_gateway: GatewayFactory, fake: FakeVLLM) -> None:
    gw = start_gateway({"public-chat": [upstream(fake)]}, limits={"max_body_bytes": 4096})
    raw = orjson.dumps(CHAT)
    deflater = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    for coding, body in (("gzip", gzip.compress(raw)), ("deflate", zlib.compress(raw)),
                         ("deflate", deflater.compress(raw) + deflater.flush()), ("identity", raw)):
        r = httpx.post(gw.url + "/v1/chat/completions", content=body,
                       headers={**AUTH, "content-type": "application/json", "content-encoding": coding})
        assert r.status_code == 200, (coding, r.text)
        sent = fake.requests_to("/v1/chat/completions")[-1]
        assert sent.json["messages"] == MSG and "content-encoding" not in sent.headers
    n = len(fake.requests_to("/v1/chat/completions"))
    bomb = gzip.compress(orjson.dumps({**CHAT, "messages": [{"role": "user", "content": "a" * 1_000_000}]}))
    assert len(bomb) < 4096
    cases = [("br", raw, 415, "unsupported_content_encoding"), ("gzip, br", raw, 415, "unsupported_content_encoding"),
             ("gzip", bomb, 413, "request_too_large"), ("gzip", b"not gzip", 400, "invalid_body"),
             ("gzip", gzip.compress(raw)[:-4], 400, "invalid_body")]
    for coding, body, status, code in cases:
        r = httpx.post(gw.url + "/v1/chat/completions", content=body,
                       headers={**AUTH, "content-type": "application/json", "content-encoding": coding})
        _error(r, status, code)
    assert len(fake.requests_to("/v1/chat/completions")) == n


# ---------------------------------------------------------------- 9, 12. readiness: the gateway's own, states only
def test_readiness_with_one_dead_model_and_no_details(
    start_gateway: GatewayFactory, fake_vllm: FakeVLLMFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.health")
    good, dead, badkey, badname = fake_vllm(), fake_vllm(), fake_vllm(), fake_vllm(served_models=("served-x",))
    dead.close_listener()
    gw = start_gateway({
        "public-chat": [upstream(good, name="good")],
        "dead-model": [upstream(dead, name="dead")],
        "badkey-model": [upstream(badkey, name="badkey", api_key="sk-wrong-backend-key")],
        "badname-model": [upstream(badname, name="badname", model="configured-y")],
    })
    for r in (httpx.get(gw.url + "/health/ready"), httpx.get(gw.url + "/health/ready", headers=AUTH)):
        assert r.status_code == 200, r.text  # the gateway serves: one dead model must not remove every replica
        body = r.json()
        assert body["status"] == "ready" and body["models_ready"] == 1
        states = {m["id"]: (m["ready"], [u["state"] for u in m["upstreams"]]) for m in body["models"]}
        assert states == {"public-chat": (True, ["ok"]), "dead-model": (False, ["down"]),
                          "badkey-model": (False, ["key_mismatch"]), "badname-model": (False, ["model_missing"])}
        for secret in ("127.0.0.1", str(dead.port), str(good.port), "served-x", "configured-y", "sk-",
                       "detail", "unreachable", "ConnectError"):
            assert secret not in r.text, secret
    # The details are in the operator's log.
    assert "served-x" in caplog.text and str(dead.port) in caplog.text
    # The healthy model keeps serving; the dead one answers a clean 503.
    assert httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers=AUTH).status_code == 200
    _error(httpx.post(gw.url + "/v1/chat/completions", json={**CHAT, "model": "dead-model"}, headers=AUTH),
           503, "upstream_unavailable")


def test_readiness_follows_the_gateways_life(start_gateway: GatewayFactory, fake: FakeVLLM) -> None:
    gw = start_gateway({"public-chat": [upstream(fake)]})
    life = gw.services.lifecycle
    assert httpx.get(gw.url + "/health/ready").status_code == 200
    life.draining = True
    r = httpx.get(gw.url + "/health/ready")
    assert r.status_code == 503 and r.json()["status"] == "draining"
    assert httpx.get(gw.url + "/health").status_code == 200  # liveness is unaffected


# ---------------------------------------------------------------- 10. log injection
def test_client_text_cannot_forge_log_lines(gw: GatewayServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    forged = ("/v1/chat/completions%0a2026-01-01%2000:00:00,000%20INFO%20gateway.access:%20POST%20/admin%20200"
              "%1b[2J%0d%00")
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
        s.sendall(f"GET {forged} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        read_until(s, lambda b: b"\r\n\r\n" in b)
    body = orjson.dumps({"model": "nope\n2026-01-01 INFO forged\x1b[31m", "messages": MSG})
    httpx.post(gw.url + "/v1/chat/completions", content=body, headers=AUTH)
    fmt = TextFormatter()
    lines = [fmt.format(r) for r in caplog.records if r.name.startswith("gateway")]
    assert any("POST /admin" in line for line in lines), lines  # the attempt was logged ...
    for line in lines:
        assert "\n" not in line and "\r" not in line and "\x1b" not in line and "\x00" not in line, line
    assert any("\\x0a2026-01-01" in line and "\\x1b[2J" in line for line in lines)  # ... as one escaped line
    for record in caplog.records:  # the JSON format escapes them too
        line = JsonFormatter().format(record)
        assert "\n" not in line and "\x1b" not in line and "\x00" not in line


# ---------------------------------------------------------------- 11. client errors are not backend errors
def test_clients_4xx_are_not_counted_as_backend_errors(http: httpx.Client, gw: GatewayServer) -> None:
    r = http.post("/v1/chat/completions", json={**CHAT, "temperature": -1})
    assert r.status_code == 400
    r = http.post("/v1/chat/completions", json={**CHAT, "messages": [{"role": "user", "content": "word " * 600}]})
    _error(r, 400, "context_length_exceeded")
    text = http.get("/metrics").text
    assert "gateway_upstream_errors_total{" not in text, text
    assert 'gateway_upstream_client_errors_total{backend="fake0",kind="http_400"} 1.0' in text
    assert 'gateway_upstream_client_errors_total{backend="fake0",kind="context_length_exceeded"} 1.0' in text


# ---------------------------------------------------------------- 13. the backend's model card
def test_models_carry_max_model_len_not_local_paths(start_gateway: GatewayFactory, fake_vllm: FakeVLLMFactory) -> None:
    a = fake_vllm(max_model_len=4096, root="/home/ops/models/secret-path")
    b = fake_vllm(max_model_len=2048, root="/home/ops/models/secret-path")
    gw = start_gateway({"public-chat": [upstream(a, name="a"), upstream(b, name="b")]})
    with openai.OpenAI(base_url=gw.url + "/v1", api_key=CLIENT_KEY, max_retries=0) as client:
        (card,) = client.models.list().data
        assert card.id == "public-chat"
        assert card.model_extra is not None and card.model_extra["max_model_len"] == 2048  # any may serve
        one = client.models.retrieve("public-chat")
        assert one.model_extra is not None and one.model_extra["max_model_len"] == 2048
    text = httpx.get(gw.url + "/v1/models", headers=AUTH).text
    assert "secret-path" not in text and "root" not in text
