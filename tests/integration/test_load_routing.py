"""Load routing through the gateway on real sockets, in front of fake vLLM servers whose /metrics
say what each test sets (the vLLM 0.32 exposition format): load_aware, least_outstanding, stale
metrics, shedding (503 model_overloaded), session affinity, in-flight accounting, the scraper."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
import yaml

from gateway.config import parse_config
from gateway.config.schema import RoutingSpec
from gateway.mappings.snapshot import ModelTable
from gateway.routing.load import LoadBoard
from gateway.routing.probe import ProbeResult, ProbeState
from gateway.routing.scrape import MetricsScraper
from gateway.settings import Settings
from tests.fakes import FakeVLLM, Hang, Respond
from tests.fakes.plugin import FakeVLLMFactory
from tests.integration.conftest import BACKEND_KEY, CLIENT_KEY, config_dict, upstream
from tests.support.gateway_server import GatewayServer

MSG = [{"role": "user", "content": "Hello"}]
FAST_SCRAPE = {"metrics_interval_s": 0.05, "metrics_stale_s": 1.0}

Start = Callable[..., GatewayServer]


@pytest.fixture
def start_routed() -> Iterator[Start]:
    """start(fakes by name, **model options, top={...}) -> a gateway serving model `m` from them."""
    started: list[GatewayServer] = []

    def start(fakes: dict[str, FakeVLLM], top: dict[str, Any] | None = None, **model: Any) -> GatewayServer:
        cfg = config_dict({"m": [upstream(f, name=n) for n, f in fakes.items()]}, **(top or {}))
        cfg["models"][0].update(model)
        gw = GatewayServer(parse_config(yaml.safe_dump(cfg), {}), Settings(access_log=False)).start()
        started.append(gw)
        return gw

    yield start
    for gw in started:
        gw.stop()


def _client(gw: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=CLIENT_KEY, max_retries=0, timeout=20)


def _chat(c: openai.OpenAI, **kw: Any) -> Any:
    return c.chat.completions.create(model="m", messages=MSG, max_tokens=4, **kw)  # type: ignore[call-overload]


def _served(fakes: dict[str, FakeVLLM]) -> dict[str, int]:
    return {n: len(f.requests_to("/v1/chat/completions")) for n, f in fakes.items()}


def _until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail("condition not reached in time")
        time.sleep(0.01)


def _scraped(gw: GatewayServer, name: str, waiting: float) -> Callable[[], bool]:
    """True once the gateway holds a fresh scrape of `name` showing `waiting` queued requests."""
    load: LoadBoard = gw.services.load

    def check() -> bool:
        s = load.fresh(name)
        return s is not None and s.waiting == waiting

    return check


def test_load_aware_sends_traffic_to_the_lighter_backend(fake_vllm: FakeVLLMFactory, start_routed: Start) -> None:
    fakes = {"busy": fake_vllm(), "idle": fake_vllm()}
    b = fakes["busy"].behaviour
    b.num_requests_running, b.num_requests_waiting, b.kv_cache_usage_perc = 4, 8, 0.6
    gw = start_routed(fakes, top={"routing": FAST_SCRAPE}, routing="load_aware")
    _until(_scraped(gw, "busy", 8))
    _until(_scraped(gw, "idle", 0))
    with _client(gw) as c:
        for _ in range(12):
            _chat(c)
        assert _served(fakes) == {"busy": 0, "idle": 12}
        # The load moves: the other one is now the lighter.
        fakes["idle"].behaviour.num_requests_waiting = 30
        b.num_requests_running, b.num_requests_waiting, b.kv_cache_usage_perc = 0, 0, 0.0
        _until(_scraped(gw, "idle", 30))
        _until(_scraped(gw, "busy", 0))
        for _ in range(6):
            _chat(c)
    assert _served(fakes) == {"busy": 6, "idle": 12}
    scrape = fakes["busy"].requests_to("/metrics")[-1]
    assert scrape.headers["authorization"] == f"Bearer {BACKEND_KEY}"  # scraped with the upstream's key
    text = httpx.get(gw.url + "/metrics", trust_env=False).text
    assert 'gateway_upstream_requests_waiting{backend="idle"} 30.0' in text
    assert 'gateway_upstream_metrics_ok{backend="busy"} 1.0' in text
    assert 'gateway_upstream_in_flight{backend="busy"} 0.0' in text


def test_load_aware_counts_requests_sent_since_the_scrape(fake_vllm: FakeVLLMFactory, start_routed: Start) -> None:
    """Between two scrapes a burst spreads out instead of piling onto the one that looked idle."""
    fakes = {"a": fake_vllm(), "b": fake_vllm()}
    for f in fakes.values():
        f.behaviour.num_requests_running = 0  # frozen numbers: only the gateway's own count moves
        f.behaviour.first_token_delay = 2.0  # all 8 are chosen before any ends, even on a busy machine
    fakes["a"].behaviour.num_requests_running = 2
    gw = start_routed(fakes, top={"routing": {"metrics_interval_s": 30, "metrics_stale_s": 60}},
                      routing="load_aware")
    with _client(gw) as c:
        async def burst() -> None:
            async with openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=CLIENT_KEY, max_retries=0) as ac:
                await asyncio.gather(*(ac.chat.completions.create(model="m", messages=MSG, max_tokens=2)  # type: ignore[arg-type]
                                       for _ in range(8)))
        asyncio.run(burst())
        # b (score 0) takes requests until its own count makes it as heavy as a (2), then they
        # alternate: 5 and 3. Without counting requests sent since the scrape, b would get all 8.
        assert _served(fakes) == {"a": 3, "b": 5}
        _chat(c)
    assert gw.services.load.in_flight("a") == gw.services.load.in_flight("b") == 0


@pytest.mark.parametrize("fault", [Respond(500, b"oops", "text/plain"), Hang()], ids=["500", "hang"])
def test_stale_or_failing_metrics_count_as_saturated(
    fake_vllm: FakeVLLMFactory, start_routed: Start, fault: Respond | Hang
) -> None:
    fakes = {"blind": fake_vllm(), "loaded": fake_vllm()}
    fakes["loaded"].behaviour.num_requests_running = 6  # loaded, but at least it tells
    fakes["blind"].inject(fault, times=None, paths=["/metrics"])  # idle, but says nothing
    gw = start_routed(fakes, top={"routing": {"metrics_interval_s": 0.05, "metrics_stale_s": 0.5}},
                      routing="load_aware")
    load: LoadBoard = gw.services.load
    _until(lambda: load.failing("blind") is not None and load.fresh("loaded") is not None)
    with _client(gw) as c:
        for _ in range(8):
            _chat(c)
    assert _served(fakes) == {"blind": 0, "loaded": 8}
    if isinstance(fault, Respond):
        text = httpx.get(gw.url + "/metrics", trust_env=False).text
        assert 'gateway_upstream_metrics_ok{backend="blind"} 0.0' in text


def test_all_backends_over_the_shed_thresholds_answers_503_model_overloaded(
    fake_vllm: FakeVLLMFactory, start_routed: Start
) -> None:
    fakes = {"q": fake_vllm(), "kv": fake_vllm()}
    fakes["q"].behaviour.num_requests_waiting = 20
    fakes["kv"].behaviour.kv_cache_usage_perc = 0.97
    gw = start_routed(fakes, top={"routing": FAST_SCRAPE}, shed={"max_waiting": 20, "max_kv_usage": 0.95})
    _until(_scraped(gw, "q", 20))
    _until(lambda: (s := gw.services.load.fresh("kv")) is not None and s.kv_usage == 0.97)
    with _client(gw) as c:
        t0 = time.monotonic()
        with pytest.raises(openai.APIStatusError) as info:
            _chat(c)
        assert time.monotonic() - t0 < 2  # at once, not after piling onto a queue
        err = info.value
        assert err.status_code == 503 and err.response.headers["retry-after"] == "1"
        assert isinstance(err.body, dict) and err.body["code"] == "model_overloaded"
        assert "127.0.0.1" not in err.message and "kv" not in err.message.split("`m`")[1]
        with pytest.raises(openai.APIStatusError):  # streaming too, before any byte
            list(c.chat.completions.create(model="m", messages=MSG, max_tokens=4, stream=True))  # type: ignore[arg-type]
        assert _served(fakes) == {"q": 0, "kv": 0}  # nothing was sent to either backend
        fakes["q"].behaviour.num_requests_waiting = 19  # one drops under: it takes the traffic
        _until(_scraped(gw, "q", 19))
        for _ in range(4):
            _chat(c)
    assert _served(fakes) == {"q": 4, "kv": 0}
    text = httpx.get(gw.url + "/metrics", trust_env=False).text
    assert 'gateway_shed_total{model="m"} 2.0' in text


def test_shed_with_stale_metrics_refuses(fake_vllm: FakeVLLMFactory, start_routed: Start) -> None:
    fake = fake_vllm()
    gw = start_routed({"only": fake}, top={"routing": {"metrics_interval_s": 0.05, "metrics_stale_s": 0.3}},
                      shed={"max_waiting": 5})
    _until(_scraped(gw, "only", 0))
    with _client(gw) as c:
        _chat(c)
        fake.inject(Hang(), times=None, paths=["/metrics"])
        _until(lambda: gw.services.load.fresh("only") is None)
        with pytest.raises(openai.APIStatusError) as info:
            _chat(c)
    assert info.value.status_code == 503 and isinstance(info.value.body, dict)
    assert info.value.body["code"] == "model_overloaded"


def test_least_outstanding_avoids_the_backend_holding_a_long_stream(
    fake_vllm: FakeVLLMFactory, start_routed: Start
) -> None:
    fakes = {"a": fake_vllm(), "b": fake_vllm()}
    for f in fakes.values():
        f.behaviour.token_delay = 0.2  # a 40-token stream lasts ~8 s
    gw = start_routed(fakes, routing="least_outstanding")
    with _client(gw) as c:
        stream = c.chat.completions.create(model="m", messages=MSG, max_tokens=40, stream=True)  # type: ignore[arg-type]
        next(iter(stream))
        holder = next(n for n, f in fakes.items() if f.in_flight == 1)
        other = "b" if holder == "a" else "a"
        fakes[other].behaviour.token_delay = 0.0
        for _ in range(10):
            _chat(c)
        served = _served(fakes)
        assert served[other] == 10 and served[holder] == 1
        assert gw.services.load.in_flight(holder) == 1
        stream.close()  # client gone mid-stream: out of the in-flight count
        _until(lambda: gw.services.load.in_flight(holder) == 0)
        assert fakes[holder].wait_for(lambda: fakes[holder].aborted == 1)


def test_affinity_sticks_and_survives_removal_of_another_backend(
    fake_vllm: FakeVLLMFactory, start_routed: Start
) -> None:
    fakes = {f"u{i}": fake_vllm() for i in range(4)}
    gw = start_routed(fakes, routing="least_outstanding", affinity="header:x-session-id")
    with _client(gw) as c:
        def owner(session: str, n: int = 5) -> str:
            before = _served(fakes)
            for _ in range(n):
                _chat(c, extra_headers={"X-Session-Id": session})
            after = _served(fakes)
            moved = {k for k in fakes if after[k] != before[k]}
            assert len(moved) == 1, f"session {session} spread over {moved}"
            return moved.pop()

        owners = {s: owner(s) for s in (f"conv-{i}" for i in range(12))}
        assert len(set(owners.values())) >= 3  # sessions spread over the backends
        # Remove one backend the way an admin edit does: a new model table without it.
        gone = Counter(owners.values()).most_common()[-1][0]
        cfg = gw.services.config.model_copy(deep=True)
        m = cfg.models[0]
        cfg_models = [m.model_copy(update={"upstreams": [u for u in m.upstreams if u.name != gone]})]
        gw.services.table = ModelTable.from_config(cfg.model_copy(update={"models": cfg_models}))
        for s, o in owners.items():
            if o != gone:
                assert owner(s, 2) == o  # untouched by the removal
            else:
                assert owner(s, 2) != gone
        # Requests without the header are balanced as usual.
        before = _served(fakes)
        for _ in range(6):
            _chat(c)
        assert sum(_served(fakes).values()) - sum(before.values()) == 6


def test_affinity_by_user_field_moves_only_while_its_backend_is_down(
    fake_vllm: FakeVLLMFactory, start_routed: Start
) -> None:
    fakes = {f"u{i}": fake_vllm() for i in range(3)}
    gw = start_routed(fakes, affinity="user")
    with _client(gw) as c:
        _chat(c, user="alice")
        home = next(n for n, f in fakes.items() if f.requests_to("/v1/chat/completions"))
        fakes[home].close_listener()  # down: alice goes elsewhere (fail-over, then the board says down)
        _chat(c, user="alice")
        _chat(c, user="alice")
        assert _served(fakes)[home] == 1
        fakes[home].reopen_listener()
        gw.services.board.set(home, ProbeResult(ProbeState.OK, "probe ok"))  # what the next probe says
        _chat(c, user="alice")
    assert _served(fakes)[home] == 2  # back home once usable again


def test_scraper_follows_upstreams_added_and_removed_at_run_time(fake_vllm: FakeVLLMFactory) -> None:
    a, b = fake_vllm(), fake_vllm()
    b.behaviour.num_requests_waiting = 3
    spec_a = parse_config(yaml.safe_dump(config_dict({"m": [upstream(a, name="a"), upstream(b, name="b")]})),
                          {}).models[0].upstreams

    async def run() -> None:
        load = LoadBoard(stale_s=1.0)
        scraper = MetricsScraper(load, RoutingSpec(metrics_interval_s=0.05, metrics_stale_s=1.0), [spec_a[0]])
        await scraper.start()
        try:
            assert load.fresh("a") is not None and load.scrape("b") is None  # the first scrape, awaited
            scraper.add([spec_a[1]])
            for _ in range(200):
                if load.fresh("b") is not None:
                    break
                await asyncio.sleep(0.01)
            s = load.fresh("b")
            assert s is not None and s.waiting == 3
            lease = load.start("a")
            scraper.remove(["a"])
            assert load.scrape("a") is None and load.in_flight("a") == 1  # data gone, count kept
            lease.release()
            n = len(a.requests_to("/metrics"))
            await asyncio.sleep(0.3)
            assert len(a.requests_to("/metrics")) <= n + 1  # at most one already on its way
            scraper.set_upstreams([])
            assert load.scrape("b") is None
            load.set_upstreams([])  # membership follows the model table
            assert load.names() == []
        finally:
            await scraper.stop()

    asyncio.run(run())


def test_in_flight_is_released_on_failed_attempts_errors_and_anthropic_routes(
    fake_vllm: FakeVLLMFactory, start_routed: Start
) -> None:
    fakes = {"bad": fake_vllm(), "good": fake_vllm()}
    fakes["bad"].fail_next(3)  # 500s: each attempt there fails over to `good`
    gw = start_routed(fakes, top={"retry": {"max_attempts": 2}})  # weighted: bad, good, bad, ... first
    load: LoadBoard = gw.services.load
    with _client(gw) as c:
        for _ in range(6):
            _chat(c)
        fakes["good"].inject(Respond(400, b'{"error":{"message":"bad","type":"BadRequestError","param":null,'
                                          b'"code":400}}'), times=2)
        fakes["bad"].inject(Respond(400, b'{"error":{"message":"bad","type":"BadRequestError","param":null,'
                                         b'"code":400}}'), times=2)
        for _ in range(2):
            with pytest.raises(openai.BadRequestError):
                _chat(c)
    for f in fakes.values():
        f.clear_faults()
    r = httpx.post(gw.url + "/v1/messages", headers={"x-api-key": CLIENT_KEY, "anthropic-version": "2023-06-01"},
                   json={"model": "m", "max_tokens": 4, "messages": MSG}, timeout=20, trust_env=False)
    assert r.status_code == 200, r.text
    assert load.in_flight("bad") == 0 and load.in_flight("good") == 0
    assert len(fakes["bad"].requests_to("/v1/chat/completions")) >= 3  # tried (and failed) 3 times


def test_model_overloaded_in_the_anthropic_envelope(fake_vllm: FakeVLLMFactory, start_routed: Start) -> None:
    fake = fake_vllm()
    fake.behaviour.num_requests_waiting = 50
    gw = start_routed({"full": fake}, top={"routing": FAST_SCRAPE}, shed={"max_waiting": 10})
    _until(_scraped(gw, "full", 50))
    r = httpx.post(gw.url + "/v1/messages", headers={"x-api-key": CLIENT_KEY, "anthropic-version": "2023-06-01"},
                   json={"model": "m", "max_tokens": 4, "messages": MSG}, timeout=20, trust_env=False)
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    body = r.json()
    assert body["type"] == "error" and "overloaded" in body["error"]["message"]
    assert fake.requests_to("/v1/messages") == [] and fake.requests_to("/v1/chat/completions") == []


def test_an_overloaded_model_falls_back_before_sending_anything(fake_vllm: FakeVLLMFactory) -> None:
    """Shedding meets fallbacks (issue 9): every backend of `m` is over its thresholds, so the request
    goes to the fallback model at once, nothing reaches the overloaded backend, and the answer keeps
    the public ID the client asked for."""
    full, spare = fake_vllm(), fake_vllm()
    full.behaviour.num_requests_waiting = 40
    cfg = config_dict({"m": [upstream(full, name="full")], "spare": [upstream(spare, name="spare")]},
                      routing=FAST_SCRAPE)
    cfg["models"][0].update(shed={"max_waiting": 10}, fallbacks=["spare"])
    gw = GatewayServer(parse_config(yaml.safe_dump(cfg), {}), Settings(access_log=False)).start()
    try:
        _until(_scraped(gw, "full", 40))
        with _client(gw) as c:
            for stream in (False, True, False):
                raw = c.chat.completions.with_raw_response.create(  # type: ignore[call-overload]
                    model="m", messages=MSG, max_tokens=4, stream=stream)
                assert raw.headers["x-gateway-served-by"] == "spare/spare"
                if stream:
                    assert {p.model for p in raw.parse()} == {"m"}
                else:
                    assert raw.parse().model == "m"
        assert len(full.requests_to("/v1/chat/completions")) == 0
        assert len(spare.requests_to("/v1/chat/completions")) == 3
        text = httpx.get(gw.url + "/metrics", trust_env=False).text
        assert 'gateway_fallbacks_total{from_model="m",to_model="spare"} 3.0' in text
        assert 'gateway_shed_total{model="m"} 3.0' in text
    finally:
        gw.stop()
