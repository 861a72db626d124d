"""The Anthropic Messages API through the gateway, with the official anthropic SDK, in front of the
fake vLLM (which answers /v1/messages and /v1/messages/count_tokens as vLLM 0.32 does)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import orjson
import pytest
import yaml

from gateway.config import parse_config
from gateway.settings import Settings
from tests.fakes import FakeVLLM, Hang, ResetAfter, Respond
from tests.fakes import anthropic_api as anth
from tests.fakes.plugin import FakeVLLMFactory
from tests.integration.conftest import BACKEND_KEY, CLIENT_KEY, LIMITED_KEY, config_dict, upstream
from tests.support.gateway_server import GatewayServer
from tests.support.rawhttp import post_json, read_until

ALIAS = "claude-house-model"  # vendor-style; not a real name (the SDK warns on deprecated ones)
MSG: Any = [{"role": "user", "content": "Hello"}]


def _start(fake: FakeVLLM, **top: Any) -> GatewayServer:
    cfg = config_dict({"public-chat": [upstream(fake, name="fake0")]}, **top)
    cfg["models"][0]["aliases"] = [ALIAS, "gpt-4o"]
    return GatewayServer(parse_config(yaml.safe_dump(cfg), {}), Settings(access_log=False)).start()


@pytest.fixture
def fake(fake_vllm: FakeVLLMFactory) -> FakeVLLM:
    return fake_vllm()


@pytest.fixture
def gw(fake: FakeVLLM) -> Iterator[GatewayServer]:
    server = _start(fake)
    yield server
    server.stop()


def _client(gw: GatewayServer, **kw: Any) -> anthropic.Anthropic:
    kw.setdefault("api_key", CLIENT_KEY)
    return anthropic.Anthropic(base_url=gw.url, max_retries=0, timeout=20, **kw)


@pytest.fixture
def client(gw: GatewayServer) -> Iterator[anthropic.Anthropic]:
    with _client(gw) as c:
        yield c


def _anthropic_error(r: httpx.Response, status: int, type_: str) -> str:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"type", "error", "request_id"} and body["type"] == "error", body
    assert set(body["error"]) == {"type", "message"} and body["error"]["type"] == type_, body
    assert r.headers["request-id"] == body["request_id"] == r.headers["x-request-id"]
    assert "Traceback" not in r.text
    return str(body["error"]["message"])


# ------------------------------------------------------------------ success


def test_create_with_x_api_key(client: anthropic.Anthropic, fake: FakeVLLM) -> None:
    raw = client.messages.with_raw_response.create(
        model="public-chat", max_tokens=4, messages=MSG,
        extra_headers={"anthropic-beta": "interleaved-thinking-2025-05-14"},
    )
    m = raw.parse()
    assert m.model == "public-chat" and m.role == "assistant" and m.stop_reason == "max_tokens"
    assert m.content[0].type == "text" and m.content[0].text == "".join(anth.api.generated_tokens(4))
    assert m.usage.input_tokens == 8 and m.usage.output_tokens == 4
    assert raw.headers["request-id"] and raw.headers["request-id"] == raw.headers["x-request-id"]
    (sent,) = fake.requests_to("/v1/messages")
    assert sent.json["model"] == "tiny"
    assert sent.headers["authorization"] == f"Bearer {BACKEND_KEY}"
    assert "x-api-key" not in sent.headers and CLIENT_KEY not in str(sent.headers)
    assert sent.headers["anthropic-version"] == raw.http_request.headers["anthropic-version"]
    assert sent.headers["anthropic-beta"] == "interleaved-thinking-2025-05-14"


def test_create_with_bearer_token_and_beta_query(gw: GatewayServer, fake: FakeVLLM) -> None:
    with anthropic.Anthropic(base_url=gw.url, auth_token=CLIENT_KEY, api_key=None, max_retries=0) as c:
        m = c.beta.messages.create(model="public-chat", max_tokens=2, messages=MSG)  # sends ?beta=true
    assert m.model == "public-chat" and m.usage.output_tokens == 2
    (sent,) = fake.requests_to("/v1/messages")
    assert sent.headers["authorization"] == f"Bearer {BACKEND_KEY}"


def test_authorization_wins_over_x_api_key(gw: GatewayServer) -> None:
    body = {"model": "public-chat", "max_tokens": 2, "messages": MSG}
    with httpx.Client(base_url=gw.url, timeout=20) as h:
        ok = h.post("/v1/messages", json=body,
                    headers={"authorization": f"Bearer {CLIENT_KEY}", "x-api-key": "sk-wrong"})
        assert ok.status_code == 200, ok.text
        bad = h.post("/v1/messages", json=body,
                     headers={"authorization": "Bearer sk-wrong", "x-api-key": CLIENT_KEY})
        _anthropic_error(bad, 401, "authentication_error")


def test_stream_deltas_arrive_incrementally(client: anthropic.Anthropic, fake: FakeVLLM) -> None:
    fake.behaviour.token_delay = 0.15
    arrivals: list[float] = []
    types: list[str] = []
    with client.messages.stream(model=ALIAS, max_tokens=5, messages=MSG) as stream:
        for ev in stream:
            types.append(ev.type)
            if ev.type == "content_block_delta":
                arrivals.append(time.monotonic())
        final = stream.get_final_message()
    assert types[0] == "message_start" and types[-1] == "message_stop"
    assert final.model == ALIAS and final.usage.input_tokens == 8 and final.usage.output_tokens == 5
    assert "".join(b.text for b in final.content if b.type == "text") == "".join(anth.api.generated_tokens(5))
    # 5 tokens 0.15 s apart: the first and last delta are spread out (not buffered into one burst).
    assert len(arrivals) == 5 and arrivals[-1] - arrivals[0] >= 0.3
    assert fake.requests_to("/v1/messages")[0].json["model"] == "tiny"


def test_stream_raw_bytes_relay_event_lines_and_rewrite_the_model(gw: GatewayServer) -> None:
    body = {"model": "gpt-4o", "max_tokens": 2, "stream": True, "messages": MSG}
    with httpx.Client(base_url=gw.url, timeout=20) as h:
        r = h.post("/v1/messages?beta=true", json=body,
                   headers={"x-api-key": CLIENT_KEY, "anthropic-version": "2023-06-01"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["request-id"]
    events = r.content.split(b"\n\n")
    assert events[0].startswith(b"event: message_start\ndata: ")
    assert b'"model":"gpt-4o"' in events[0] and b"tiny" not in r.content
    assert events[-2] == b'event: message_stop\ndata: {"type":"message_stop"}' and events[-1] == b""
    assert b"event: error" not in r.content


def test_count_tokens(client: anthropic.Anthropic, fake: FakeVLLM) -> None:
    r = client.messages.count_tokens(model=ALIAS, messages=MSG, system="Be brief.")
    assert r.input_tokens == 19  # vLLM: sum of (8 + tokens) over system and messages, minus 1
    (sent,) = fake.requests_to("/v1/messages/count_tokens")
    assert sent.json["model"] == "tiny" and sent.headers["authorization"] == f"Bearer {BACKEND_KEY}"


def test_root_probe_needs_no_key(gw: GatewayServer) -> None:
    with httpx.Client(base_url=gw.url, timeout=10) as h:
        head = h.head("/")
        get = h.get("/")
    assert head.status_code == 200 and head.content == b""
    assert get.status_code == 200 and get.json()["status"] == "ok"


def test_path_forgiveness(gw: GatewayServer) -> None:
    body = {"model": "public-chat", "max_tokens": 2, "messages": MSG}
    with httpx.Client(base_url=gw.url, headers={"x-api-key": CLIENT_KEY}, timeout=20) as h:
        for path in ("/messages", "/v1/v1/messages/", "/v1/messages?beta=true", "/v1/v1/messages/count_tokens"):
            r = h.post(path, json=body)
            assert r.status_code == 200, (path, r.text)
    with anthropic.Anthropic(base_url=gw.url + "/v1", api_key=CLIENT_KEY, max_retries=0) as c:
        assert c.messages.create(model="public-chat", max_tokens=2, messages=MSG).usage.output_tokens == 2


# ------------------------------------------------------------------ aliases and models


def test_models_list_formats_and_aliases(gw: GatewayServer) -> None:
    with httpx.Client(base_url=gw.url, timeout=10) as h:
        oa = h.get("/v1/models", headers={"authorization": f"Bearer {CLIENT_KEY}"}).json()
        assert [m["id"] for m in oa["data"]] == ["public-chat"] and oa["object"] == "list"
        an = h.get("/v1/models", headers={"x-api-key": CLIENT_KEY, "anthropic-version": "2023-06-01"})
        assert an.status_code == 200 and an.headers["request-id"]
        body = an.json()
        assert body["has_more"] is False and body["first_id"] == body["last_id"] == "public-chat"
        (m,) = body["data"]
        assert m["type"] == "model" and m["id"] == "public-chat" and m["display_name"]
        assert m["created_at"].endswith("Z")
        one = h.get(f"/v1/models/{ALIAS}", headers={"x-api-key": CLIENT_KEY, "anthropic-version": "2023-06-01"})
        assert one.json()["id"] == ALIAS and one.json()["type"] == "model"
        oa_one = h.get("/v1/models/gpt-4o", headers={"authorization": f"Bearer {CLIENT_KEY}"})
        assert oa_one.json()["id"] == "gpt-4o"
        missing = h.get("/v1/models", headers={"anthropic-version": "2023-06-01"})
        _anthropic_error(missing, 401, "authentication_error")
        nope = h.get("/v1/models/nope", headers={"x-api-key": CLIENT_KEY, "anthropic-version": "2023-06-01"})
        _anthropic_error(nope, 404, "not_found_error")
    with anthropic.Anthropic(base_url=gw.url, api_key=CLIENT_KEY, max_retries=0) as c:
        assert [m.id for m in c.models.list()] == ["public-chat"]
        assert c.models.retrieve(ALIAS).id == ALIAS


def test_alias_works_on_openai_routes_too(gw: GatewayServer, fake: FakeVLLM) -> None:
    with httpx.Client(base_url=gw.url, headers={"authorization": f"Bearer {CLIENT_KEY}"}, timeout=10) as h:
        r = h.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": MSG, "max_tokens": 2})
        assert r.status_code == 200 and r.json()["model"] == "gpt-4o"
        s = h.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": MSG, "max_tokens": 2,
                                                 "stream": True})
        assert b'"model":"gpt-4o"' in s.content and b'"model":"tiny"' not in s.content
    assert {r.json["model"] for r in fake.requests_to("/v1/chat/completions")} == {"tiny"}


def test_alias_respects_key_scope(fake_vllm: FakeVLLMFactory) -> None:
    fake0, fake1 = fake_vllm(), fake_vllm()
    cfg = config_dict({"public-chat": [upstream(fake0)], "other": [upstream(fake1)]})
    cfg["models"][1]["aliases"] = ["claude-haiku"]
    with GatewayServer(parse_config(yaml.safe_dump(cfg), {})) as gw, \
            anthropic.Anthropic(base_url=gw.url, api_key=LIMITED_KEY, max_retries=0) as c:
        with pytest.raises(anthropic.NotFoundError) as exc:
            c.messages.create(model="claude-haiku", max_tokens=2, messages=MSG)
        assert exc.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
        assert "claude-haiku" in exc.value.message and "other" not in exc.value.message
    assert fake1.requests_to("/v1/messages") == []


# ------------------------------------------------------------------ errors: the SDK's exception classes


def test_authentication_errors(gw: GatewayServer) -> None:
    with _client(gw, api_key="sk-wrong") as c, pytest.raises(anthropic.AuthenticationError) as exc:
        c.messages.create(model="public-chat", max_tokens=2, messages=MSG)
    assert exc.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    with httpx.Client(base_url=gw.url, timeout=10) as h:
        msg = _anthropic_error(h.post("/v1/messages", json={"model": "x"}), 401, "authentication_error")
    assert "x-api-key" in msg


def test_not_found_model_and_path(client: anthropic.Anthropic, gw: GatewayServer) -> None:
    with pytest.raises(anthropic.NotFoundError) as exc:
        client.messages.create(model="claude-opus-4", max_tokens=2, messages=MSG)
    assert exc.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    assert "public-chat" in exc.value.message and ALIAS not in exc.value.message
    with httpx.Client(base_url=gw.url, headers={"x-api-key": CLIENT_KEY}, timeout=10) as h:
        _anthropic_error(h.post("/v1/messages/batches", json={}), 404, "not_found_error")
        r = h.get("/v1/messages")
        _anthropic_error(r, 405, "invalid_request_error")
        assert r.headers["allow"] == "POST"


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b'{"model":"public-chat","messages":[', "JSON"),
        (b'{"model":"public-chat","max_tokens":4}', "messages"),
        (b'{"model":"public-chat","messages":[{"role":"user","content":"Hello"}]}', "max_tokens"),  # vLLM's
        (b'{"model":"public-chat","max_tokens":4,"messages":[]}', "empty conversation"),  # vLLM's BadRequestError
        (b'{"model":"public-chat","max_tokens":4000,"messages":[{"role":"user","content":"Hi"}]}',
         "max_completion_tokens=4000"),
        (b'{"model":"public-chat","max_tokens":4,"messages":[{"role":"user","content":"Hi"}],'
         b'"tools":[{"name":"t","input_schema":{"type":"object"}}]}', "--enable-auto-tool-choice"),
    ],
)
def test_bad_requests(gw: GatewayServer, body: bytes, needle: str) -> None:
    with httpx.Client(base_url=gw.url, headers={"x-api-key": CLIENT_KEY}, timeout=10) as h:
        r = h.post("/v1/messages", content=body, headers={"content-type": "application/json"})
    assert needle in _anthropic_error(r, 400, "invalid_request_error")


def test_bad_request_class_and_context_length(client: anthropic.Anthropic) -> None:
    long = " ".join(["hello"] * 600)
    with pytest.raises(anthropic.BadRequestError) as exc:
        client.messages.create(model="public-chat", max_tokens=4, messages=[{"role": "user", "content": long}])
    assert "maximum context length" in exc.value.message
    assert exc.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]


def test_request_too_large(fake: FakeVLLM) -> None:
    gw = _start(fake, limits={"max_body_bytes": 2048})
    try:
        with _client(gw) as c, pytest.raises(anthropic.ContentTooLargeError) as exc:
            c.messages.create(model="public-chat", max_tokens=2, messages=[{"role": "user", "content": "x" * 4096}])
        assert exc.value.body["error"]["type"] == "request_too_large"  # type: ignore[index]
    finally:
        gw.stop()


@pytest.mark.parametrize(
    ("fault", "cls", "status", "type_"),
    [
        (Respond(429, b'{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}'),
         anthropic.RateLimitError, 429, "rate_limit_error"),
        (Respond(500), anthropic.InternalServerError, 502, "api_error"),
        (Respond(502, b"<html><body>Bad Gateway</body></html>", "text/html"),
         anthropic.InternalServerError, 502, "api_error"),
        (Respond(200, b"<html>hi</html>", "text/html"), anthropic.InternalServerError, 502, "api_error"),
        (Respond(401, b'{"error":"Unauthorized"}'), anthropic.InternalServerError, 502, "api_error"),
    ],
    ids=["429", "5xx", "html-502", "html-200", "wrong-backend-key"],
)
def test_backend_failures(fake: FakeVLLM, fault: Respond, cls: type[anthropic.APIStatusError], status: int,
                          type_: str) -> None:
    gw = _start(fake, retry={"max_attempts": 1})
    try:
        fake.inject(fault, times=None, paths=["/v1/messages"])
        with _client(gw) as c, pytest.raises(cls) as exc:
            c.messages.create(model="public-chat", max_tokens=2, messages=MSG)
        assert exc.value.status_code == status
        assert exc.value.body["error"]["type"] == type_  # type: ignore[index]
        assert exc.value.request_id
        assert BACKEND_KEY not in exc.value.message
    finally:
        gw.stop()


def test_backend_down_and_timeout(fake_vllm: FakeVLLMFactory) -> None:
    fake = fake_vllm()
    gw = _start(fake, timeouts={"first_byte": 1})
    try:
        fake.inject(Hang(), paths=["/v1/messages"])
        with _client(gw) as c, pytest.raises(anthropic.GatewayTimeoutError) as t:
            c.messages.create(model="public-chat", max_tokens=2, messages=MSG)
        assert t.value.body["error"]["type"] == "timeout_error"  # type: ignore[index]
        fake.close_listener()
        with _client(gw) as c, pytest.raises(anthropic.ServiceUnavailableError) as down:
            c.messages.create(model="public-chat", max_tokens=2, messages=MSG)
        assert down.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
        assert down.value.status_code == 503
    finally:
        gw.stop()


# ------------------------------------------------------------------ errors in the middle of a stream


def _stream_raw(gw: GatewayServer, model: str = "public-chat") -> bytes:
    with httpx.Client(base_url=gw.url, timeout=20) as h:
        r = h.post("/v1/messages", json={"model": model, "max_tokens": 6, "stream": True, "messages": MSG},
                   headers={"x-api-key": CLIENT_KEY})
    assert r.status_code == 200
    return r.content


def _one_error_at_the_end(raw: bytes) -> dict[str, Any]:
    assert raw.count(b"event: error") == 1 and raw.endswith(b"\n\n"), raw
    last = raw.rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
    assert last.startswith(b"event: error\ndata: ")
    body: dict[str, Any] = orjson.loads(last.split(b"data: ", 1)[1])
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    return body


def test_mid_stream_reset_ends_with_one_error_event(gw: GatewayServer, fake: FakeVLLM) -> None:
    fake.inject(ResetAfter(chunks=3), paths=["/v1/messages"])
    raw = _stream_raw(gw)
    assert raw.startswith(b"event: message_start")
    body = _one_error_at_the_end(raw)
    assert body["error"]["type"] == "api_error" and "fake0" in body["error"]["message"]
    fake.inject(ResetAfter(chunks=3), paths=["/v1/messages"])
    with _client(gw) as c, pytest.raises(anthropic.APIStatusError) as exc:
        with c.messages.stream(model="public-chat", max_tokens=6, messages=MSG) as s:
            for _ in s:
                pass
    assert exc.value.body["error"]["type"] == "api_error"  # type: ignore[index]


def test_vllm_error_event_is_normalised(gw: GatewayServer, fake: FakeVLLM) -> None:
    good = anth.stream_events(anth.api.Generation.make("chatcmpl-", "tiny", 8, [2]))
    chunks = [good[0][1], good[1][1], anth.error_event("internal_error", "Invalid data format received")]
    fake.inject(Respond(200, chunks, "text/event-stream; charset=utf-8"), paths=["/v1/messages"])
    raw = _stream_raw(gw, ALIAS)
    assert b'"model":"' + ALIAS.encode() + b'"' in raw
    body = _one_error_at_the_end(raw)
    assert body["error"] == {"type": "api_error", "message": "Invalid data format received"}


def test_stream_cut_cleanly_without_message_stop(gw: GatewayServer, fake: FakeVLLM) -> None:
    good = anth.stream_events(anth.api.Generation.make("chatcmpl-", "tiny", 8, [2]))
    fake.inject(Respond(200, [e for _, e in good[:-1]], "text/event-stream"), paths=["/v1/messages"])
    body = _one_error_at_the_end(_stream_raw(gw))
    assert body["error"]["type"] == "api_error" and "before it was complete" in body["error"]["message"]


# ------------------------------------------------------------------ usage (the seam for rate limits)


def test_usage_is_recorded_in_the_access_log(fake: FakeVLLM, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="gateway.access")
    cfg = config_dict({"public-chat": [upstream(fake, name="fake0")]})
    with GatewayServer(parse_config(yaml.safe_dump(cfg), {}), Settings(access_log=True)) as gw, _client(gw) as c:
        c.messages.create(model="public-chat", max_tokens=3, messages=MSG)
        with c.messages.stream(model="public-chat", max_tokens=5, messages=MSG) as s:
            s.until_done()

        def usages() -> list[tuple[Any, Any]]:
            return [(getattr(r, "input_tokens", None), getattr(r, "output_tokens", None))
                    for r in caplog.records if r.name == "gateway.access" and getattr(r, "path", "") == "/v1/messages"]

        deadline = time.monotonic() + 10
        while len(usages()) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)  # polling for the log line written after the last byte
    assert usages() == [(8, 3), (8, 5)]


def test_wrong_backend_key_is_a_502_that_explains(fake_vllm: FakeVLLMFactory) -> None:
    fake = fake_vllm()
    cfg = config_dict({"public-chat": [upstream(fake, name="gpu0", api_key="sk-drifted-backend")]})
    with GatewayServer(parse_config(yaml.safe_dump(cfg), {})) as gw, _client(gw) as c:
        with pytest.raises(anthropic.InternalServerError) as exc:
            c.messages.create(model="public-chat", max_tokens=2, messages=MSG)
        with pytest.raises(anthropic.InternalServerError) as streamed:
            with c.messages.stream(model="public-chat", max_tokens=2, messages=MSG) as s:
                s.until_done()
    for e in (exc.value, streamed.value):
        assert e.status_code == 502 and e.body["error"]["type"] == "api_error"  # type: ignore[index]
        assert "--api-key" in e.message and "gpu0" in e.message and "sk-drifted-backend" not in e.message


def test_client_disconnect_mid_stream_aborts_the_backend(gw: GatewayServer, fake: FakeVLLM) -> None:
    fake.behaviour.token_delay = 0.2
    body = orjson.dumps({"model": "public-chat", "max_tokens": 50, "stream": True, "messages": MSG})
    s = post_json(gw.port, "/v1/messages", body, CLIENT_KEY)
    try:
        seen = read_until(s, lambda b: b"event: content_block_delta" in b)
        assert b"HTTP/1.1 200" in seen and b"request-id: " in seen
    finally:
        s.close()
    assert fake.wait_for(lambda: fake.aborted == 1, timeout=10)
    assert fake.completed == 0
