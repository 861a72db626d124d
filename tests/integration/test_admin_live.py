"""Admin edits going live: two gateway instances on one Redis (an edit on A served by B within a
second, keys created and revoked across instances, a deleted model gone everywhere), 200 edits under
streaming and non-streaming load with zero failed requests, ?verify=true, reload and SIGHUP."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis
import yaml

from gateway.admin.overlay import Entry, State
from gateway.admin.store import AdminSetupError, StoreError
from gateway.app import create_app
from gateway.auth.keys import hash_key
from gateway.config import parse_config
from gateway.settings import Settings
from tests.fakes import FakeVLLM
from tests.fakes.plugin import FakeVLLMFactory
from tests.integration.admin_helpers import (
    ADMIN_KEY,
    StartAdmin,
    Store,
    admin,
    admin_config,
    chat,
    model_body,
    start_admin,
    store,
)
from tests.integration.conftest import BACKEND_KEY, CLIENT_KEY
from tests.support.gateway_server import GatewayServer

__all__ = ["start_admin", "store"]

redis_only = pytest.mark.parametrize("store", ["redis"], indirect=True)


def within(seconds: float, ok: Callable[[], bool]) -> float:
    """Poll ``ok`` until it holds; the time it took (fails the test after ``seconds``)."""
    start = time.monotonic()
    while not ok():
        if time.monotonic() - start > seconds:
            raise AssertionError(f"not within {seconds}s")
        time.sleep(0.01)
    return time.monotonic() - start


@redis_only
def test_two_instances_on_one_redis_agree_within_a_second(start_admin: StartAdmin, fake: FakeVLLM) -> None:
    cfg = admin_config(fake)
    a_gw, b_gw = start_admin(cfg), start_admin(cfg)
    lags: list[float] = []
    with admin(a_gw) as a, admin(b_gw) as b:
        a.post("/models", json=model_body("from-a", fake)).raise_for_status()
        lags.append(within(1.0, lambda: chat(b_gw, "from-a").status_code == 200))

        secret = a.post("/keys", json={"name": "team"}).json()["key"]
        lags.append(within(1.0, lambda: chat(b_gw, "public-chat", secret).status_code == 200))
        a.delete("/keys/team").raise_for_status()
        lags.append(within(1.0, lambda: chat(b_gw, "public-chat", secret).status_code == 401))

        a.delete("/models/from-a").raise_for_status()
        lags.append(within(1.0, lambda: chat(b_gw, "from-a").status_code == 404))
        assert b.get("/models/from-a").status_code == 404

        sa, sb = a.get("/status").json(), b.get("/status").json()
        assert sa["version"] == sb["version"] == 4 and sa["instance_id"] != sb["instance_id"]
        metrics = httpx.get(b_gw.url + "/metrics", trust_env=False).text
        assert "gateway_config_version 4.0" in metrics
    print(f"cross-instance apply lags (s): {[round(x, 3) for x in lags]}")


@redis_only
def test_an_instance_that_missed_the_message_catches_up_by_version(start_admin: StartAdmin, fake: FakeVLLM,
                                                                   store: Store) -> None:
    cfg = admin_config(fake)
    b_gw = start_admin(cfg)
    admin_b = b_gw.app.app.state.admin  # type: ignore[attr-defined]
    admin_b.store.poll_s = 0.3  # the slow poll, shortened for the test
    # Another instance's edit whose notification never arrived: written straight into Redis with
    # no PUBLISH (what a subscriber cut off by a network blip sees).
    overlay = State().with_model("late", Entry(model_body("late", fake), 1))
    assert store.redis is not None
    r = redis.Redis.from_url(store.redis.url)
    try:
        r.set("{gateway:admin}:state", json.dumps(overlay.to_json()))
        r.set("{gateway:admin}:version", 1)
    finally:
        r.close()
    within(6.0, lambda: admin_b.version == 1)  # the poll in progress may still wait its 5 s
    assert chat(b_gw, "late").status_code == 200


@redis_only
def test_startup_loads_the_current_state(start_admin: StartAdmin, fake: FakeVLLM) -> None:
    cfg = admin_config(fake)
    a_gw = start_admin(cfg)
    with admin(a_gw) as a:
        a.post("/models", json=model_body("early", fake)).raise_for_status()
    b_gw = start_admin(cfg)
    assert chat(b_gw, "early").status_code == 200


def _load(url: str, stop: threading.Event, results: dict[str, int], concurrency: int = 6) -> None:
    async def worker(i: int, client: openai.AsyncOpenAI) -> None:
        while not stop.is_set():
            try:
                if i % 2:
                    s = await client.chat.completions.create(
                        model="public-chat", messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                        stream=True)
                    n = 0
                    async for _ in s:
                        n += 1
                    assert n > 0
                else:
                    r = await client.chat.completions.create(
                        model="public-chat", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
                    assert r.choices
                results["ok"] += 1
            except Exception as exc:  # every failure counts, whatever it is
                results["failed"] += 1
                results.setdefault("first_error", repr(exc))  # type: ignore[arg-type]

    async def main() -> None:
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=CLIENT_KEY, max_retries=0,
                                      timeout=20) as client:
            await asyncio.gather(*(worker(i, client) for i in range(concurrency)))

    asyncio.run(main())


def test_200_edits_under_load_fail_no_request(start_admin: StartAdmin, fake: FakeVLLM,
                                              fake_vllm: FakeVLLMFactory) -> None:
    second, third = fake_vllm(), fake_vllm()
    for f in (fake, second, third):
        f.behaviour.token_delay = 0.002
    gw = start_admin(admin_config(fake))
    results: dict[str, Any] = {"ok": 0, "failed": 0}
    stop = threading.Event()
    loader = threading.Thread(target=_load, args=(gw.url, stop, results), daemon=True)
    loader.start()
    extra = {"name": "extra", "url": second.url, "model": "tiny", "api_key": BACKEND_KEY}
    edits = 0
    started = time.monotonic()
    try:
        with admin(gw) as a:
            while edits < 200:
                steps: list[Callable[[], httpx.Response]] = [
                    lambda: a.post("/models/public-chat/upstreams", json=extra),
                    lambda: a.patch("/models/public-chat/upstreams/extra", json={"weight": 0}),
                    lambda: a.patch("/models/public-chat/upstreams/extra", json={"weight": 2}),
                    lambda: a.patch("/models/public-chat/upstreams/fake0", json={"weight": 0}),
                    lambda: a.patch("/models/public-chat/upstreams/fake0", json={"weight": 1}),
                    lambda: a.patch("/models/public-chat", json={"upstreams": [
                        {"name": "fake0", "url": fake.url, "model": "tiny"},
                        {"name": "extra", "url": third.url, "model": "tiny", "api_key": BACKEND_KEY}]}),
                    lambda: a.delete("/models/public-chat/upstreams/extra"),
                ]
                for step in steps:
                    r = step()
                    assert r.status_code in (200, 201), r.text
                    edits += 1
    finally:
        elapsed = time.monotonic() - started
        stop.set()
        loader.join(timeout=30)
    print(f"{edits} edits in {elapsed:.1f}s during {results['ok']} client requests, {results['failed']} failed")
    assert results["failed"] == 0, results.get("first_error")
    assert results["ok"] > 50
    assert len(third.requests_to("/v1/chat/completions")) > 0  # the replaced upstream did serve
    assert gw.services.table.version == edits  # every edit went live, one version each


def test_verify_refuses_an_upstream_that_fails_its_probe(start_admin: StartAdmin, fake: FakeVLLM,
                                                          fake_vllm: FakeVLLMFactory) -> None:
    gw = start_admin(admin_config(fake))
    with admin(gw) as a:
        r = a.post("/models?verify=true", json=model_body("m", fake, served="not-served"))
        assert r.status_code == 502
        err = r.json()["error"]
        assert err["code"] == "upstream_verify_failed" and err["param"] == "upstreams.0"
        assert "does not serve 'not-served'" in err["message"]
        bad_key = model_body("m", fake)
        bad_key["upstreams"][0]["api_key"] = "sk-wrong"
        r = a.post("/models?verify=true", json=bad_key)
        assert r.status_code == 502 and "--api-key" in r.json()["error"]["message"]
        down = fake_vllm()
        url = down.url
        down.stop()
        r = a.post("/models/public-chat/upstreams?verify=true", json={"name": "d", "url": url, "model": "tiny"})
        assert r.status_code == 502 and "unreachable" in r.json()["error"]["message"]
        assert a.get("/models").json()["data"][0]["upstreams"][-1]["name"] == "fake0"
        assert a.post("/models?verify=true", json=model_body("m", fake)).status_code == 201


def test_reload_rereads_the_file_and_keeps_the_overlay(tmp_path: Path, fake: FakeVLLM) -> None:
    cfg_path = tmp_path / "gateway.yaml"
    cfg = admin_config(fake)
    cfg_path.write_text(yaml.safe_dump(cfg))
    settings = Settings(access_log=False, admin_key=ADMIN_KEY, config=cfg_path)
    gw = GatewayServer(parse_config(cfg_path.read_text(), {}), settings,
                       loader=lambda: parse_config(cfg_path.read_text(), {})).start()
    try:
        with admin(gw) as a:
            a.post("/models", json=model_body("added", fake)).raise_for_status()
            cfg["models"].append({"id": "from-file", "upstreams": [
                {"name": "f1", "url": fake.url, "model": "tiny", "api_key": BACKEND_KEY}]})
            cfg_path.write_text(yaml.safe_dump(cfg))
            assert chat(gw, "from-file").status_code == 404
            r = a.post("/reload")
            assert r.status_code == 200, r.text
            assert r.json()["restart_needed"] == []
            assert chat(gw, "from-file").status_code == 200 and chat(gw, "added").status_code == 200
            assert {m["id"]: m["source"] for m in a.get("/models").json()["data"]} == {
                "public-chat": "config", "from-file": "config", "added": "admin"}
            # admin.keys are re-read too: a key added to the file works at once.
            cfg["admin"]["keys"].append({"name": "late-ops", "key_sha256": hash_key("adm-late-key-0123456789")})
            cfg_path.write_text(yaml.safe_dump(cfg))
            assert a.post("/reload").json()["restart_needed"] == []  # admin.keys are live
            with admin(gw, "adm-late-key-0123456789") as late:
                assert late.get("/status").status_code == 200
            # Sections read only at start-up: the reload says which changed, and they keep running as they were.
            cfg["timeouts"] = {"first_byte": 7}
            cfg["admin"]["audit_size"] = 50
            cfg_path.write_text(yaml.safe_dump(cfg))
            r = a.post("/reload")
            assert r.status_code == 200 and r.json()["restart_needed"] == ["timeouts", "admin"]
            assert gw.services.config.timeouts.first_byte != 7
            cfg_path.write_text("models: [")
            r = a.post("/reload")
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_config"
            assert chat(gw, "from-file").status_code == 200  # the running mapping stays
        assert (tmp_path / "gateway-state.json").exists()  # the default: beside the config file
    finally:
        gw.stop()


def test_unwritable_state_file_is_a_clear_startup_error(tmp_path: Path, fake: FakeVLLM) -> None:
    config = parse_config(yaml.safe_dump(admin_config(fake)), {})
    missing = tmp_path / "nope" / "state.json"
    with pytest.raises(StoreError, match="does not exist"):
        create_app(Settings(admin_key=ADMIN_KEY, state_file=missing), config)
    # /proc takes no new files, whoever asks (root included).
    with pytest.raises(StoreError, match="not writable"):
        create_app(Settings(admin_key=ADMIN_KEY, state_file=Path("/proc/gateway-state.json")), config)


def test_sighup_reloads(tmp_path: Path, fake: FakeVLLM) -> None:
    """SIGHUP reaches the handler only on the main thread's loop: run the app's lifespan here."""
    cfg_path = tmp_path / "gateway.yaml"
    cfg = admin_config(fake)
    cfg_path.write_text(yaml.safe_dump(cfg))
    settings = Settings(access_log=False, admin_key=ADMIN_KEY, config=cfg_path)

    def loader() -> Any:
        return parse_config(cfg_path.read_text(), {})

    app = create_app(settings, loader(), loader=loader)
    inner = app.app  # type: ignore[attr-defined]

    async def main() -> list[str]:
        async with inner.router.lifespan_context(inner):
            before = [e for e in inner.state.services.table.entries]
            cfg["models"].append({"id": "hup", "upstreams": [
                {"name": "h1", "url": fake.url, "model": "tiny", "api_key": BACKEND_KEY}]})
            cfg_path.write_text(yaml.safe_dump(cfg))
            os.kill(os.getpid(), signal.SIGHUP)
            for _ in range(200):
                if "hup" in inner.state.services.table.entries:
                    break
                await asyncio.sleep(0.01)
            assert before == ["public-chat"]
            return list(inner.state.services.table.entries)

    assert asyncio.run(main()) == ["public-chat", "hup"]


def test_a_placeholder_admin_key_is_a_startup_error(fake: FakeVLLM) -> None:
    config = parse_config(yaml.safe_dump(admin_config(fake)), {})
    for bad in ("CHANGE_ME_admin_key", "short"):
        with pytest.raises(AdminSetupError, match="GATEWAY_ADMIN_KEY"):
            create_app(Settings(admin_key=bad), config)


def test_redis_cluster_store_two_instances(fake: FakeVLLM, redis_cluster: Any, tmp_path: Path) -> None:
    """On a Redis Cluster (one hash slot for the overlay; version polled every 250 ms, no pub/sub)."""
    import redis.cluster

    rc = redis.cluster.RedisCluster.from_url(redis_cluster.url)
    try:
        rc.delete("{gateway:admin}:state", "{gateway:admin}:version", "{gateway:admin}:audit")
    finally:
        rc.close()
    config = parse_config(yaml.safe_dump(admin_config(fake)), {})
    url = "redis+cluster://" + redis_cluster.url.removeprefix("redis://")
    settings = Settings(access_log=False, admin_key=ADMIN_KEY, redis_url=url)
    with GatewayServer(config, settings) as a_gw, GatewayServer(config, settings) as b_gw:
        with admin(a_gw) as a:
            a.post("/models", json=model_body("on-cluster", fake)).raise_for_status()
            secret = a.post("/keys", json={"name": "c"}).json()["key"]
            lag = within(1.0, lambda: chat(b_gw, "on-cluster", secret).status_code == 200)
            a.delete("/keys/c").raise_for_status()
            within(1.0, lambda: chat(b_gw, "on-cluster", secret).status_code == 401)
            assert a.get("/status").json()["store"] == "redis"
            assert [e["action"] for e in a.get("/audit").json()["data"]] == ["key.delete", "key.create",
                                                                            "model.create"]
    print(f"cluster apply lag {lag:.3f}s")


def test_a_stream_outlives_the_removal_of_its_upstream(start_admin: StartAdmin, fake: FakeVLLM,
                                                       fake_vllm: FakeVLLMFactory) -> None:
    slow = fake_vllm()
    slow.behaviour.token_delay = 0.05
    gw = start_admin(admin_config(fake))
    with admin(gw) as a:
        a.post("/models", json=model_body("slow", slow, name="slow0")).raise_for_status()
        with openai.OpenAI(base_url=gw.url + "/v1", api_key=CLIENT_KEY, max_retries=0, timeout=20) as c:
            stream = c.chat.completions.create(model="slow", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=20, stream=True)
            chunks = iter(stream)
            first = next(chunks)
            assert slow.in_flight == 1
            # Replace the model's only upstream while the stream runs on it.
            a.put("/models/slow", json=model_body("slow", fake, name="fast0")).raise_for_status()
            rest = list(chunks)
        assert first.choices and len(rest) >= 19 and rest[-1].choices[0].finish_reason == "length"
        # The old pool is closed once its last request is done; new requests go to the new upstream.
        assert slow.wait_for(lambda: slow.in_flight == 0)
        before = len(slow.requests_to("/v1/chat/completions"))
        assert chat(gw, "slow").status_code == 200
        assert len(slow.requests_to("/v1/chat/completions")) == before
        clients = gw.services.clients
        within(2.0, lambda: not clients._retiring)


@redis_only
def test_redis_down_refuses_edits_with_503_and_keeps_serving(start_admin: StartAdmin, fake: FakeVLLM,
                                                             store: Store) -> None:
    gw = start_admin(admin_config(fake))
    assert store.redis is not None
    with admin(gw) as a:
        a.post("/models", json=model_body("m", fake)).raise_for_status()
        store.redis.stop()
        r = a.post("/models", json=model_body("n", fake, name="n0"))
        assert r.status_code == 503 and r.json()["error"]["code"] == "admin_store_unavailable"
        assert chat(gw, "m").status_code == 200  # the served mapping stays
        assert a.get("/models/m").status_code == 200
