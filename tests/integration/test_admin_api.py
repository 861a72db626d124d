"""The admin API's contract, the same for the file store and the Redis store (real redis-server):
CRUD over HTTP against a real gateway, validation errors with field paths, secrets never echoed,
409 on conflicts, persistence across restarts, tombstones, audit."""

from __future__ import annotations

import concurrent.futures
import json
import time

import httpx
import pytest

from tests.fakes import FakeVLLM
from tests.integration.admin_helpers import (
    ADMIN_KEY,
    CONFIG_ADMIN_KEY,
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

__all__ = ["start_admin", "store"]


def test_model_crud_round_trip_serves_the_new_mapping(start_admin: StartAdmin, fake: FakeVLLM) -> None:
    gw = start_admin(admin_config(fake))
    with admin(gw) as a:
        listed = a.get("/models").json()
        assert listed["object"] == "list"
        assert [(m["id"], m["source"], m["version"]) for m in listed["data"]] == [("public-chat", "config", 1)]
        assert chat(gw, "new-model").status_code == 404

        r = a.post("/models", json=model_body("new-model", fake, aliases=["nm"], rpm=100))
        assert r.status_code == 201, r.text
        m = r.json()
        assert (m["id"], m["source"], m["version"], m["aliases"], m["rpm"]) == ("new-model", "admin", 1, ["nm"], 100)
        assert m["upstreams"][0]["api_key_set"] is True and "api_key" not in m["upstreams"][0]
        assert chat(gw, "new-model").status_code == 200
        assert chat(gw, "nm").json()["model"] == "nm"

        got = a.get("/models/new-model").json()
        assert got == m
        # GET-edit-PUT without the key keeps the key (the backend demands it).
        got["upstreams"][0]["weight"] = 3
        r = a.put("/models/new-model", json=got)
        assert r.status_code == 200, r.text
        assert r.json()["version"] == 2 and r.json()["upstreams"][0]["weight"] == 3
        assert r.json()["upstreams"][0]["api_key_set"] is True
        assert chat(gw, "new-model").status_code == 200

        r = a.patch("/models/new-model", json={"aliases": []})
        assert r.status_code == 200 and r.json()["version"] == 3
        assert chat(gw, "nm").status_code == 404

        r = a.delete("/models/new-model")
        assert r.status_code == 200 and r.json() == {"id": "new-model", "deleted": True}
        assert chat(gw, "new-model").status_code == 404
        assert a.get("/models/new-model").status_code == 404
        assert [m["id"] for m in a.get("/models").json()["data"]] == ["public-chat"]


def test_upstreams_one_by_one_drain_and_delete(start_admin: StartAdmin, fake: FakeVLLM,
                                                fake_vllm: object) -> None:
    other = fake_vllm()  # type: ignore[operator]
    gw = start_admin(admin_config(fake))
    with admin(gw) as a:
        r = a.post("/models/public-chat/upstreams", json={"name": "fake1", "url": other.url, "model": "tiny",
                                                           "api_key": BACKEND_KEY})
        assert r.status_code == 201, r.text
        assert [u["name"] for u in r.json()["upstreams"]] == ["fake0", "fake1"]
        assert r.json()["source"] == "admin"

        def state(name: str) -> str:
            return next(b["state"] for b in a.get("/backends").json()["data"] if b["name"] == name)

        # Probed at once (the periodic probe is 30 s away), with a metric series of its own.
        deadline = time.monotonic() + 2
        while state("fake1") != "up" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert state("fake1") == "up"
        assert 'gateway_upstream_up{backend="fake1",model="public-chat"} 1.0' in httpx.get(
            gw.url + "/metrics", trust_env=False).text
        r = a.patch("/models/public-chat/upstreams/fake0", json={"weight": 0})
        assert r.status_code == 200, r.text
        assert r.json()["upstreams"][0]["weight"] == 0 and r.json()["upstreams"][0]["api_key_set"] is True
        before = len(other.requests_to("/v1/chat/completions"))
        for _ in range(4):
            assert chat(gw, "public-chat").status_code == 200
        assert len(other.requests_to("/v1/chat/completions")) == before + 4  # fake0 is drained
        backends = {b["name"]: b for b in a.get("/backends").json()["data"]}
        assert backends["fake0"]["weight"] == 0 and backends["fake1"]["model"] == "public-chat"
        assert set(backends["fake1"]) >= {"name", "model", "url", "state", "reason", "in_flight", "last_probe",
                                          "weight", "kind", "circuit", "scrape"}
        assert backends["fake1"]["circuit"] == "closed" and backends["fake1"]["kind"] == "vllm"
        assert backends["fake1"]["scrape"] is None  # a weighted model without shed: not scraped
        assert a.delete("/models/public-chat/upstreams/fake0").json() == {"name": "fake0", "deleted": True}
        assert a.patch("/models/public-chat/upstreams/nope", json={"weight": 1}).status_code == 404
        r = a.delete("/models/public-chat/upstreams/fake1")
        assert r.status_code == 400 and r.json()["error"]["param"] == "upstreams"
        assert "fake0" not in {b["name"] for b in a.get("/backends").json()["data"]}
        assert 'backend="fake0"' not in httpx.get(gw.url + "/metrics", trust_env=False).text
        assert chat(gw, "public-chat").status_code == 200


def test_validation_errors_name_the_field(start_admin: StartAdmin, fake: FakeVLLM) -> None:
    gw = start_admin(admin_config(fake))
    with admin(gw) as a:
        bad = model_body("m", fake)
        bad["upstreams"][0]["url"] = "ftp://nowhere"
        r = a.post("/models", json=bad)
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["param"] == "upstreams.0.url" and err["message"].startswith("upstreams[0].url: ")
        assert err["type"] == "invalid_request_error"
        r = a.post("/models", json={**model_body("m", fake), "colour": "red"})
        assert r.json()["error"]["param"] == "colour" and "unknown field" in r.json()["error"]["message"]
        r = a.post("/models", json=model_body("m", fake, name="fake0"))  # upstream name taken by public-chat
        assert r.status_code == 400 and r.json()["error"]["param"] == "upstreams.0.name"
        r = a.post("/models", json=model_body("m", fake, aliases=["public-chat"]))
        assert r.json()["error"]["param"] == "aliases.0"
        r = a.post("/models", content=b"[1]", headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
        r = a.post("/keys", json={"name": "k", "models": ["nope"]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "models.0"
        r = a.post("/keys", json={"name": "k", "burst_tokens": 5})
        assert r.status_code == 400 and "burst_tokens" in r.json()["error"]["message"]
        assert a.post("/models", json=model_body("public-chat", fake, name="x")).status_code == 409
        assert [m["id"] for m in a.get("/models").json()["data"]] == ["public-chat"]


def test_keys_secret_once_hashed_and_revocable(start_admin: StartAdmin, fake: FakeVLLM, store: Store) -> None:
    gw = start_admin(admin_config(fake))
    with admin(gw) as a:
        r = a.post("/keys", json={"name": "team-a", "models": ["public-chat"], "rpm": 600})
        assert r.status_code == 201, r.text
        created = r.json()
        secret = created.pop("key")
        assert secret.startswith("sk-gw-") and created["prefix"] == secret[:10]
        assert created == {"name": "team-a", "prefix": secret[:10], "models": ["public-chat"], "rpm": 600,
                           "tpm": None, "max_parallel": None, "burst_requests": None, "burst_tokens": None,
                           "per_model": {}, "source": "admin", "version": 1}
        assert chat(gw, "public-chat", secret).status_code == 200
        keys = {k["name"]: k for k in a.get("/keys").json()["data"]}
        assert keys["team-a"] == created and keys["full"]["source"] == "config"
        assert all("key" not in k for k in keys.values())
        assert a.post("/keys", json={"name": "team-a"}).status_code == 409
        r = a.patch("/keys/team-a", json={"max_parallel": 2})
        assert r.status_code == 200 and r.json()["max_parallel"] == 2 and r.json()["version"] == 2
        assert a.patch("/keys/team-a", json={"key_sha256": "0" * 64}).status_code == 400
        assert a.delete("/keys/team-a").json() == {"name": "team-a", "deleted": True}
        assert chat(gw, "public-chat", secret).status_code == 401
        # Nothing echoes the secret: not the list, not the audit log, not the stored state.
        assert secret not in a.get("/keys").text and secret not in a.get("/audit").text
        assert BACKEND_KEY not in a.get("/audit").text and BACKEND_KEY not in a.get("/models").text
        if store.kind == "file":
            assert secret not in store.state_file.read_text()


def test_if_match_and_concurrent_conflicting_edits(start_admin: StartAdmin, fake: FakeVLLM) -> None:
    gw = start_admin(admin_config(fake))
    with admin(gw) as a:
        a.post("/models", json=model_body("m", fake)).raise_for_status()
        assert a.patch("/models/m", json={"rpm": 5}, headers={"If-Match": "7"}).status_code == 409
        r = a.patch("/models/m", json={"rpm": 5}, headers={"If-Match": "1"})
        assert r.status_code == 200 and r.json()["version"] == 2
        stale = a.patch("/models/m", json={"rpm": 6}, headers={"If-Match": "1"})
        assert stale.status_code == 409 and stale.json()["error"]["code"] == "version_conflict"
        assert a.patch("/models/m", json={}, headers={"If-Match": "abc"}).status_code == 400

    def edit(i: int) -> int:
        with admin(gw) as c:
            return c.patch("/models/m", json={"rpm": 10 + i}, headers={"If-Match": "2"}).status_code

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        codes = sorted(pool.map(edit, range(8)))
    assert codes == [200] + [409] * 7
    with admin(gw) as a:
        assert a.get("/models/m").json()["version"] == 3


def test_edits_persist_across_restarts_with_tombstones(start_admin: StartAdmin, fake: FakeVLLM) -> None:
    cfg = admin_config(fake, models=[
        {"id": "public-chat", "upstreams": [{"name": "fake0", "url": fake.url, "model": "tiny",
                                             "api_key": BACKEND_KEY}]},
        {"id": "doomed", "upstreams": [{"name": "d0", "url": fake.url, "model": "tiny", "api_key": BACKEND_KEY}]}])
    gw = start_admin(cfg)
    with admin(gw) as a:
        a.post("/models", json=model_body("added", fake)).raise_for_status()
        a.delete("/models/doomed").raise_for_status()
        secret = a.post("/keys", json={"name": "kept"}).json()["key"]
        a.delete("/keys/full").raise_for_status()  # a config key, revoked: a tombstone
    gw.stop()
    gw2 = start_admin(cfg)
    with admin(gw2) as a:
        models = {m["id"]: m["source"] for m in a.get("/models").json()["data"]}
        assert models == {"public-chat": "config", "added": "admin"}
        assert chat(gw2, "doomed", secret).status_code == 404
        assert chat(gw2, "added", secret).status_code == 200
        assert chat(gw2, "public-chat", CLIENT_KEY).status_code == 401
        # Re-creating a deleted model continues its version.
        r = a.post("/models", json=model_body("doomed", fake, name="d1"))
        assert r.status_code == 201 and r.json()["version"] == 3
        audit = a.get("/audit").json()["data"]
        assert [e["action"] for e in audit][:5] == ["model.create", "key.delete", "key.create", "model.delete",
                                                    "model.create"]
        assert audit[3]["before"]["id"] == "doomed" and audit[3]["after"] is None
        assert {e["admin"] for e in audit} == {"env"}
        status = a.get("/status").json()
        assert status["version"] == 5 and status["store"] in ("file", "redis") and status["instance_id"]


def test_admin_auth_401_403_and_config_keys(start_admin: StartAdmin, fake: FakeVLLM) -> None:
    gw = start_admin(admin_config(fake))
    with admin(gw, "wrong") as a:
        r = a.get("/models")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    with admin(gw, CLIENT_KEY) as a:
        r = a.get("/models")
        assert r.status_code == 403 and r.json()["error"]["code"] == "permission_denied"
        assert a.post("/keys", json={"name": "x"}).status_code == 403
    with admin(gw, CONFIG_ADMIN_KEY) as a:
        a.post("/keys", json={"name": "by-ops"}).raise_for_status()
        assert a.get("/audit").json()["data"][0]["admin"] == "ops"
    assert httpx.get(gw.url + "/admin/models", trust_env=False).status_code == 401


def test_admin_api_is_404_without_an_admin_key(start_admin: StartAdmin, fake: FakeVLLM) -> None:
    cfg = admin_config(fake)
    cfg.pop("admin")
    gw = start_admin(cfg, admin_key=None)
    for key in (ADMIN_KEY, CLIENT_KEY, "nonsense"):
        with admin(gw, key) as a:
            for path in ("/models", "/keys", "/status", "/backends"):
                r = a.get(path)
                assert r.status_code == 404, (key, path)
                assert r.json()["error"]["code"] == "unknown_url"


def test_usage_is_valid_and_counts_requests(start_admin: StartAdmin, fake: FakeVLLM, store: Store) -> None:
    gw = start_admin(admin_config(fake))
    assert chat(gw, "public-chat").status_code == 200
    with admin(gw) as a:
        assert a.get("/usage", params={"days": 0}).status_code == 400
        if store.kind == "redis":  # the recorder flushes to Redis in the background: poll for it
            deadline = time.monotonic() + 5
            while not a.get("/usage", params={"days": 2}).json()["data"] and time.monotonic() < deadline:
                time.sleep(0.05)
        body = a.get("/usage", params={"days": 2}).json()
        assert body["object"] == "list" and body["days"] == 2
        if store.kind == "redis":
            row = body["data"][0]
            assert (row["key"], row["model"], row["requests"]) == ("full", "public-chat", 1)
            assert row["total_tokens"] == row["prompt_tokens"] + row["completion_tokens"] > 0
        else:
            assert body["data"] == []


@pytest.mark.parametrize("store", ["file"], indirect=True)
def test_state_file_is_atomic_json_and_private(start_admin: StartAdmin, fake: FakeVLLM, store: Store) -> None:
    gw = start_admin(admin_config(fake))
    with admin(gw) as a:
        a.post("/models", json=model_body("m", fake)).raise_for_status()
    data = json.loads(store.state_file.read_text())
    assert data["version"] == 1 and data["models"]["m"]["version"] == 1
    assert store.state_file.stat().st_mode & 0o077 == 0
    assert not [p for p in store.state_file.parent.iterdir() if p.name.startswith(".gateway-state.json.")]


def test_edited_limits_take_effect(start_admin: StartAdmin, fake: FakeVLLM) -> None:
    gw = start_admin(admin_config(fake))
    with admin(gw) as a:
        secret = a.post("/keys", json={"name": "metered"}).json()["key"]
        for _ in range(3):
            assert chat(gw, "public-chat", secret).status_code == 200
        a.patch("/keys/metered", json={"rpm": 1}).raise_for_status()
        assert chat(gw, "public-chat", secret).status_code == 200
        r = chat(gw, "public-chat", secret)
        assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
        # A model-wide limit set through the API binds every key.
        a.patch("/models/public-chat", json={"max_parallel": 1, "rpm": 1}).raise_for_status()
        assert chat(gw, "public-chat").status_code == 200
        assert chat(gw, "public-chat").status_code == 429


def test_a_model_a_key_names_cannot_be_deleted(start_admin: StartAdmin, fake: FakeVLLM) -> None:
    gw = start_admin(admin_config(fake))
    with admin(gw) as a:
        a.post("/models", json=model_body("m", fake)).raise_for_status()
        a.post("/keys", json={"name": "only-m", "models": ["m"]}).raise_for_status()
        r = a.delete("/models/m")
        assert r.status_code == 409 and r.json()["error"]["code"] == "in_use"
        assert "'only-m'" in r.json()["error"]["message"]
        a.patch("/keys/only-m", json={"models": ["public-chat"]}).raise_for_status()
        assert a.delete("/models/m").status_code == 200


def test_launch_sections_are_write_only_and_survive_a_round_trip(start_admin: StartAdmin, fake: FakeVLLM) -> None:
    cfg = admin_config(fake)
    cfg["models"][0]["upstreams"][0]["launch"] = {"model_path": "/models/x", "env": {"HF_TOKEN": "hf-secret-1"}}
    gw = start_admin(cfg)
    with admin(gw) as a:
        got = a.get("/models/public-chat").json()
        assert got["upstreams"][0]["launch_set"] is True and "launch" not in got["upstreams"][0]
        assert "hf-secret-1" not in a.get("/models").text
        got["owned_by"] = "me"
        assert a.put("/models/public-chat", json=got).status_code == 200
    up = gw.services.config.models[0].upstreams[0]
    assert up.launch is not None and up.launch.env == {"HF_TOKEN": "hf-secret-1"}
    assert up.api_key_value() == BACKEND_KEY and gw.services.config.models[0].owned_by == "me"


def test_a_backend_key_that_cannot_be_a_header_value_is_a_400_that_does_not_echo_it(
    start_admin: StartAdmin, fake: FakeVLLM
) -> None:
    gw = start_admin(admin_config(fake))
    with admin(gw) as a:
        r = a.post("/models/public-chat/upstreams", json={"name": "fake1", "url": fake.url, "model": "tiny",
                                                           "api_key": "sk-line-break-secret\n"})
        assert r.status_code == 400, r.text
        assert "api_key" in r.text and "printable ASCII" in r.text and "line-break-secret" not in r.text
        r = a.patch("/models/public-chat/upstreams/fake0", json={"api_key": "sk-tab\tsecret"})
        assert r.status_code == 400 and "sk-tab" not in r.text and "printable ASCII" in r.text
        assert [u["name"] for u in a.get("/models/public-chat").json()["upstreams"]] == ["fake0"]
