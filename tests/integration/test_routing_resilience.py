"""Resilience through the real gateway: circuit breakers, retries with backoff, fallbacks to a cloud
provider (`kind: openai`), faults injected into fake vLLM servers on 127.0.0.1 (issue 9)."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
import yaml

from gateway.config import parse_config
from gateway.settings import Settings
from tests.fakes import FakeVLLM, Hang, Respond, StallAfter
from tests.fakes.plugin import FakeVLLMFactory
from tests.integration.conftest import BACKEND_KEY, CLIENT_KEY, LIMITED_KEY
from tests.support.gateway_server import GatewayServer

MSG = [{"role": "user", "content": "Hello"}]
CLOUD_KEY = "sk-cloud-provider"
UNAVAILABLE = (b'{"error":{"message":"The server is overloaded","type":"ServiceUnavailable",'
               b'"param":null,"code":503}}')

Start = Callable[..., GatewayServer]


def up(fake: FakeVLLM, name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "url": fake.url + "/v1", "model": "tiny", "api_key": BACKEND_KEY, **extra}


@pytest.fixture
def start() -> Iterator[Start]:
    servers: list[GatewayServer] = []

    def go(models: list[dict[str, Any]], **top: Any) -> GatewayServer:
        cfg = {"models": models,
               "keys": [{"name": "full", "key": CLIENT_KEY},
                        {"name": "limited", "key": LIMITED_KEY, "models": [models[0]["id"]]}],
               "health": {"interval_s": 30, "timeout_s": 1}, **top}
        gw = GatewayServer(parse_config(yaml.safe_dump(cfg), {}), Settings(access_log=False)).start()
        servers.append(gw)
        return gw

    yield go
    for s in servers:
        s.stop()


def sdk(gw: GatewayServer, key: str = CLIENT_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0, timeout=20)


def metric(gw: GatewayServer, line_start: str) -> float:
    text = httpx.get(gw.url + "/metrics").text
    for line in text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def circuits(gw: GatewayServer) -> dict[str, str]:
    ready = httpx.get(gw.url + "/health/ready").json()
    return {u["name"]: u["circuit"] for m in ready["models"] for u in m["upstreams"]}


def chat(c: openai.OpenAI, stream: bool, model: str = "public-chat") -> str:
    if stream:
        parts = list(c.chat.completions.create(model=model, messages=MSG, max_tokens=4,  # type: ignore[call-overload]
                                               stream=True))
        assert parts and all(p.model == model for p in parts)
        return "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
    r = c.chat.completions.create(model=model, messages=MSG, max_tokens=4)  # type: ignore[arg-type]
    assert r.model == model
    return r.choices[0].message.content or ""


def drive_kill_and_return(a: FakeVLLM, b: FakeVLLM, gw: GatewayServer, streams_may_run: threading.Event,
                          results: list[tuple[bool, float, str | None]], parked: Callable[[], int]) -> None:
    assert a.wait_for(lambda: a.completed >= 6) and b.wait_for(lambda: b.completed >= 6)
    # A stream whose first byte already reached its client cannot be saved by any gateway: the kill
    # comes while no stream is on a (non-streaming requests keep running and are cut mid-way).
    streams_may_run.clear()
    deadline = time.monotonic() + 10
    while parked() < 3:  # every stream worker done with its stream and waiting
        assert time.monotonic() < deadline
        time.sleep(0.01)
    a.close_listener()  # refused from now on, open connections (non-streaming requests among them) reset
    streams_may_run.set()
    n_kill = len(results)
    deadline = time.monotonic() + 10
    while len(results) < n_kill + 40:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    ready = {u["name"]: u for u in httpx.get(gw.url + "/health/ready").json()["models"][0]["upstreams"]}
    assert ready["a"]["state"] == "down" or ready["a"]["circuit"] == "open"  # ejected
    served_a = len(a.requests_to("/v1/chat/completions"))
    a.reopen_listener()  # the replica is back: the next probe closes its circuit
    assert a.wait_for(lambda: len(a.requests_to("/v1/chat/completions")) > served_a + 3, timeout=10)


def test_replica_killed_under_mixed_load_no_failures_ejected_and_readmitted(
    start: Start, fake_vllm: FakeVLLMFactory
) -> None:
    a, b = fake_vllm(), fake_vllm()
    for f in (a, b):
        f.behaviour.first_token_delay = 0.05
    connect_s, backoff_ms = 1.0, 50
    gw = start([{"id": "public-chat", "upstreams": [up(a, "a"), up(b, "b")]}],
               timeouts={"connect": connect_s}, retry={"max_attempts": 3, "backoff_ms": backoff_ms},
               breaker={"failures": 2, "cool_down_s": 30}, health={"interval_s": 0.2, "timeout_s": 1})
    streams_may_run = threading.Event()
    streams_may_run.set()
    stop = threading.Event()
    results: list[tuple[bool, float, str | None]] = []  # (stream, seconds, error)
    waiting = 0
    lock = threading.Lock()

    def worker(stream: bool) -> None:
        nonlocal waiting
        with sdk(gw) as c:
            while not stop.is_set():
                if stream and not streams_may_run.is_set():
                    with lock:
                        waiting += 1
                    streams_may_run.wait()
                    with lock:
                        waiting -= 1
                t0 = time.monotonic()
                try:
                    chat(c, stream)
                    results.append((stream, time.monotonic() - t0, None))
                except openai.APIError as exc:
                    results.append((stream, time.monotonic() - t0, repr(exc)))

    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(worker, i % 2 == 0) for i in range(6)]
        try:
            drive_kill_and_return(a, b, gw, streams_may_run, results, lambda: waiting)
        finally:
            stop.set()
            streams_may_run.set()
        for f in futures:
            f.result()
    failed = [r for r in results if r[2] is not None]
    assert failed == [] and len(results) > 60
    slowest = max(s for _, s, _ in results)
    print(f"\nkill test: {len(results)} requests, 0 failed, slowest {slowest * 1000:.0f} ms")
    assert slowest < connect_s + backoff_ms * 2 / 1000 + 0.5, slowest  # 0.5 s: generation and scheduling
    assert circuits(gw)["a"] == "closed"
    assert metric(gw, 'gateway_upstream_circuit_state{upstream="a"}') == 0
    assert sum(metric(gw, f'gateway_retries_total{{model="public-chat",reason="{r}"}}')
               for r in ("connect", "reset")) >= 1


def test_backend_that_accepts_and_never_answers_is_not_retried_and_its_circuit_opens(
    start: Start, fake_vllm: FakeVLLMFactory, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = fake_vllm(), fake_vllm()
    a.inject(Hang(), times=None)
    gw = start([{"id": "public-chat", "upstreams": [up(a, "a"), up(b, "b")]}],
               timeouts={"first_byte": 0.4}, breaker={"failures": 2, "cool_down_s": 60})
    codes = []
    with caplog.at_level(logging.INFO, logger="gateway.breaker"), httpx.Client(
            base_url=gw.url, headers={"Authorization": f"Bearer {CLIENT_KEY}"}, timeout=10) as c:
        for _ in range(8):
            r = c.post("/v1/chat/completions", json={"model": "public-chat", "messages": MSG, "max_tokens": 2})
            codes.append(r.status_code)
            if r.status_code == 504:
                assert r.json()["error"]["code"] == "upstream_timeout"
                assert r.headers["x-should-retry"] == "false"
    # Round-robin sends requests 1 and 3 to the hanging a: each a 504 sent once (never run twice),
    # the second opens a's circuit and every later request goes to b.
    assert codes == [504, 200, 504, 200, 200, 200, 200, 200]
    assert len(a.requests_to("/v1/chat/completions")) == 2 and len(b.requests_to("/v1/chat/completions")) == 6
    assert circuits(gw) == {"a": "open", "b": "closed"}
    assert metric(gw, 'gateway_upstream_circuit_state{upstream="a"}') == 2
    opened = [r.getMessage() for r in caplog.records if "circuit closed -> open" in r.getMessage()]
    assert opened == ["upstream a circuit closed -> open: 2 consecutive failures, last: upstream_timeout"]
    assert httpx.get(gw.url + "/health/ready").status_code == 200  # readiness is the gateway's, not a backend's


def test_503_twice_then_200_is_retried_with_backoff_and_logged_with_the_request_id(
    start: Start, fake: FakeVLLM, caplog: pytest.LogCaptureFixture
) -> None:
    gw = start([{"id": "public-chat", "upstreams": [up(fake, "solo")]}], retry={"max_attempts": 3, "backoff_ms": 50})
    fake.fail_next(2, status=503, body=UNAVAILABLE)
    with caplog.at_level(logging.INFO, logger="gateway.upstream"), sdk(gw) as c:
        raw = c.chat.completions.with_raw_response.create(model="public-chat", messages=MSG,  # type: ignore[arg-type]
                                                          max_tokens=2)
    assert raw.parse().model == "public-chat"
    assert raw.headers["x-gateway-served-by"] == "public-chat/solo"
    rid = raw.headers["x-request-id"]
    assert len(fake.requests_to("/v1/chat/completions")) == 3
    retries = [r for r in caplog.records if r.getMessage().startswith("retry ")]
    assert [getattr(r, "request_id", None) for r in retries] == [rid, rid]
    assert all("after http_503" in r.getMessage() for r in retries)
    assert metric(gw, 'gateway_retries_total{model="public-chat",reason="http_503"}') == 2
    # A validation error is never retried.
    fake.inject(Respond(400, b'{"error":{"message":"bad","type":"BadRequestError","param":null,"code":400}}'))
    with sdk(gw) as c, pytest.raises(openai.BadRequestError) as info:
        chat(c, False)
    assert info.value.response.headers["x-gateway-served-by"] == "public-chat/solo"
    assert len(fake.requests_to("/v1/chat/completions")) == 4


def test_retries_stop_at_max_attempts_and_the_total_deadline(start: Start, fake: FakeVLLM) -> None:
    gw = start([{"id": "public-chat", "upstreams": [up(fake, "solo")]}],
               retry={"max_attempts": 10, "backoff_ms": 300}, timeouts={"total": 1.0})
    fake.inject(Respond(503, UNAVAILABLE), times=None)
    t0 = time.monotonic()
    r = httpx.post(gw.url + "/v1/chat/completions", json={"model": "public-chat", "messages": MSG},
                   headers={"Authorization": f"Bearer {CLIENT_KEY}"}, timeout=10)
    took = time.monotonic() - t0
    assert r.status_code == 503 and r.json()["error"]["code"] == "upstream_unavailable"
    # Backoff caps 0.3, 0.6, 1.2 s...: a wait that would reach the 1 s deadline is not started.
    assert took < 1.2, took
    assert 1 <= len(fake.requests_to("/v1/chat/completions")) < 10


# Closing the fake's listener while the kernel hands it a new connection leaves that server-side
# socket to the garbage collector (asyncio's accept path on 3.11): a leak in the fake, not the gateway.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_flapping_backend_costs_no_request(start: Start, fake_vllm: FakeVLLMFactory) -> None:
    a, b = fake_vllm(), fake_vllm()
    gw = start([{"id": "public-chat", "upstreams": [up(a, "a"), up(b, "b")]}],
               breaker={"failures": 2, "cool_down_s": 0.1}, health={"interval_s": 0.1, "timeout_s": 1})
    stop = threading.Event()
    flips = 0

    def flap() -> None:  # down and up again between requests (an answer cut mid-way is lost whatever a
        nonlocal flips   # gateway does: the generation ran; that case is test_stall_mid_stream...)
        while not stop.is_set():
            a.close_listener(drop_connections="idle")
            stop.wait(0.07)
            a.reopen_listener()
            stop.wait(0.07)
            flips += 1

    t = threading.Thread(target=flap)
    t.start()
    try:
        with sdk(gw) as c:
            i = 0
            while i < 60 or (flips < 3 and i < 5000):  # at least 60 requests, across at least 3 flaps
                assert chat(c, i % 2 == 0)
                i += 1
    finally:
        stop.set()
        t.join()
    assert flips >= 3
    # Every request succeeded (above); b, always up, took at least its share. How many `a` got depends on
    # where its flaps fell (under a loaded CI machine its circuit may stay open throughout).
    served = len(a.requests_to("/v1/chat/completions")), len(b.requests_to("/v1/chat/completions"))
    assert served[1] >= 30 and sum(served) >= 60


def test_stall_mid_stream_ends_with_error_event_and_done_without_retry(
    start: Start, fake_vllm: FakeVLLMFactory
) -> None:
    a, b = fake_vllm(), fake_vllm()
    gw = start([{"id": "public-chat", "upstreams": [up(a, "a", weight=1), up(b, "b", weight=0)]}],
               timeouts={"idle": 0.4})
    a.inject(StallAfter(chunks=2))
    r = httpx.post(gw.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {CLIENT_KEY}"},
                   json={"model": "public-chat", "messages": MSG, "stream": True}, timeout=10)
    events = r.content.split(b"\n\n")
    assert r.status_code == 200 and r.headers["x-gateway-served-by"] == "public-chat/a"
    assert events[-3].startswith(b'data: {"error":{') and b"upstream_timeout" in events[-3]
    assert events[-2] == b"data: [DONE]"
    assert b.requests_to("/v1/chat/completions") == []  # bytes reached the client: never retried


def test_breaker_through_the_proxy_open_half_open_closed(start: Start, fake: FakeVLLM) -> None:
    gw = start([{"id": "public-chat", "upstreams": [up(fake, "solo")]}], breaker={"failures": 2, "cool_down_s": 0.3},
               retry={"max_attempts": 1})
    fake.inject(Respond(500), times=None)  # vLLM's "engine dead"
    h = {"Authorization": f"Bearer {CLIENT_KEY}"}
    body = {"model": "public-chat", "messages": MSG, "max_tokens": 2}
    for _ in range(2):
        assert httpx.post(gw.url + "/v1/chat/completions", json=body, headers=h).status_code == 502
    r = httpx.post(gw.url + "/v1/chat/completions", json=body, headers=h)
    assert r.status_code == 503 and r.json()["error"]["code"] == "no_upstream_available"
    assert r.headers["retry-after"] == "1"
    assert len(fake.requests_to("/v1/chat/completions")) == 2  # the open circuit got nothing
    assert circuits(gw) == {"solo": "open"}
    fake.clear_faults()
    deadline = time.monotonic() + 3  # poll until the cool-down is over and the trial goes through
    while (r := httpx.post(gw.url + "/v1/chat/completions", json=body, headers=h)).status_code != 200:
        assert r.json()["error"]["code"] == "no_upstream_available" and time.monotonic() < deadline
        time.sleep(0.05)
    assert circuits(gw) == {"solo": "closed"}
    assert len(fake.requests_to("/v1/chat/completions")) == 3


@pytest.mark.parametrize("fault", ["down", "503"])
def test_fallback_to_a_cloud_provider(
    start: Start, fake_vllm: FakeVLLMFactory, fault: str
) -> None:
    local = fake_vllm()
    cloud = fake_vllm(served_models=("gpt-cloud",), api_key=CLOUD_KEY, cloud=True)
    gw = start([
        {"id": "public-chat", "fallbacks": ["cloud-chat"], "upstreams": [up(local, "local")]},
        {"id": "cloud-chat", "upstreams": [{"name": "cloud", "kind": "openai", "url": cloud.url + "/v1",
                                             "model": "gpt-cloud", "api_key": CLOUD_KEY,
                                             "timeouts": {"first_byte": 30}}]},
    ], breaker={"failures": 3, "cool_down_s": 60})
    if fault == "down":
        local.close_listener()
    else:
        local.inject(Respond(503, UNAVAILABLE), times=None)
    with sdk(gw, LIMITED_KEY) as c:  # this key may use public-chat only: the fallback is the operator's choice
        for i in range(6):
            raw = c.chat.completions.with_raw_response.create(  # type: ignore[call-overload]
                model="public-chat", messages=MSG, max_tokens=3, stream=i % 2 == 1)
            assert raw.headers["x-gateway-served-by"] == "cloud-chat/cloud"
            if i % 2:
                parts = list(raw.parse())
                assert parts and {p.model for p in parts} == {"public-chat"}
            else:
                assert raw.parse().model == "public-chat"
        with pytest.raises(openai.NotFoundError):  # ... which does not give it the fallback model itself
            chat(c, False, model="cloud-chat")
    sent = cloud.requests_to("/v1/chat/completions")
    assert len(sent) == 6
    assert all(r.headers["authorization"] == f"Bearer {CLOUD_KEY}" and r.json["model"] == "gpt-cloud" for r in sent)
    assert cloud.requests_to("/health") == [] and cloud.requests_to("/metrics") == []
    assert len(cloud.requests_to("/v1/models")) == 1  # probed by its model list, at start
    assert metric(gw, 'gateway_fallbacks_total{from_model="public-chat",to_model="cloud-chat"}') == 6
    if fault == "503":  # 3 attempts each for the first request, then the circuit is open: straight to the cloud
        assert len(local.requests_to("/v1/chat/completions")) == 3
        assert circuits(gw)["local"] == "open"


def test_a_passive_cloud_upstream_is_never_probed_and_only_its_breaker_judges_it(
    start: Start, fake_vllm: FakeVLLMFactory
) -> None:
    cloud = fake_vllm(served_models=("gpt-cloud",), api_key=CLOUD_KEY, cloud=True)
    gw = start([{"id": "public-chat", "upstreams": [
        {"name": "cloud", "kind": "openai", "probe": "passive", "url": cloud.url, "model": "gpt-cloud",
         "api_key": CLOUD_KEY}]}], breaker={"failures": 1, "cool_down_s": 0.2}, retry={"max_attempts": 1})
    with sdk(gw) as c:
        assert chat(c, True)
        cloud.close_listener()
        with pytest.raises(openai.APIStatusError):
            chat(c, False)
        ready = httpx.get(gw.url + "/health/ready").json()["models"][0]
        assert ready["upstreams"] == [{"name": "cloud", "state": "unknown", "circuit": "open"}] and not ready["ready"]
        cloud.reopen_listener()
        deadline = time.monotonic() + 3
        while True:  # after the cool-down one trial request closes the circuit again
            try:
                assert chat(c, False)
                break
            except openai.APIStatusError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
    assert cloud.requests == [r for r in cloud.requests if r.path == "/v1/chat/completions"]
    assert re.fullmatch(r"closed", circuits(gw)["cloud"])


def test_no_fallback_for_what_the_request_itself_got_wrong(start: Start, fake_vllm: FakeVLLMFactory) -> None:
    local = fake_vllm()
    cloud = fake_vllm(served_models=("gpt-cloud",), api_key=CLOUD_KEY, cloud=True)
    gw = start([
        {"id": "public-chat", "fallbacks": ["cloud-chat"], "upstreams": [up(local, "local")]},
        {"id": "cloud-chat", "upstreams": [{"name": "cloud", "kind": "openai", "url": cloud.url,
                                             "model": "gpt-cloud", "api_key": CLOUD_KEY}]},
    ])
    h = {"Authorization": f"Bearer {CLIENT_KEY}"}
    r = httpx.post(gw.url + "/v1/embeddings", json={"model": "public-chat", "input": "hi"}, headers=h)
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_endpoint"  # a chat model
    local.inject(Respond(400, b'{"error":{"message":"bad","type":"BadRequestError","param":null,"code":400}}'))
    r = httpx.post(gw.url + "/v1/chat/completions", json={"model": "public-chat", "messages": MSG}, headers=h)
    assert r.status_code == 400
    local.inject(Respond(503, UNAVAILABLE), times=None)
    r = httpx.post(gw.url + "/v1/chat/completions", json={"model": "public-chat", "messages": MSG}, headers=h)
    assert r.status_code == 200 and r.headers["x-gateway-served-by"] == "cloud-chat/cloud"
    assert cloud.requests_to("/v1/embeddings") == [] and len(cloud.requests_to("/v1/chat/completions")) == 1
