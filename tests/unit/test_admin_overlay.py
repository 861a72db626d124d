"""The admin overlay merged onto the config file (pure), and the file store's compare-and-set."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gateway.admin.overlay import Entry, State, invalid, merge, model_to_dict, parse_model
from gateway.admin.store import FileStore, StoreError
from gateway.config import parse_config
from gateway.config.schema import GatewayConfig, ModelSpec
from gateway.errors import InvalidRequest

BASE = """
models:
  - id: a
    upstreams: [{name: a0, url: "http://127.0.0.1:9001/v1", model: m, api_key: sk-up-a}]
  - id: b
    upstreams: [{url: "http://127.0.0.1:9002", model: m}]
keys:
  - {name: k1, key: sk-client-one-xyz}
  - {name: k2, key_sha256: "%s"}
""" % ("ab" * 32)


def base() -> GatewayConfig:
    return parse_config(BASE, {})


def spec(mid: str, name: str, **extra: Any) -> dict[str, Any]:
    return {"id": mid, "upstreams": [{"name": name, "url": "http://127.0.0.1:9003", "model": "m"}], **extra}


def test_no_overlay_is_the_file_with_config_sources() -> None:
    m = merge(base(), State())
    assert [x.id for x in m.config.models] == ["a", "b"]
    assert {k: (v.source, v.version) for k, v in m.models.items()} == {"a": ("config", 1), "b": ("config", 1)}
    assert m.keys["k1"].prefix == "sk-client-" and m.keys["k2"].prefix is None
    assert m.version == 0


def test_replace_in_place_add_after_and_tombstones_hide_file_entries() -> None:
    state = (State().with_model("c", Entry(spec("c", "c0"), 1))
             .with_model("a", Entry(spec("a", "a9", rpm=5), 2))
             .with_model("b", Entry(None, 2))
             .with_key("k2", Entry(None, 2)))
    m = merge(base(), state)
    assert [x.id for x in m.config.models] == ["a", "c"]
    assert m.config.models[0].upstreams[0].name == "a9" and m.config.models[0].rpm == 5
    assert (m.models["a"].source, m.models["a"].version) == ("admin", 2)
    assert [k.name for k in m.config.keys] == ["k1"]
    assert m.version == 4


def test_state_json_round_trip() -> None:
    state = State().with_model("x", Entry(spec("x", "x0"), 3)).with_key("k", Entry(None, 2, "sk-gw-abcd"))
    assert State.from_json(state.to_json()) == state


def test_model_to_dict_keeps_the_secret_for_the_store_and_round_trips() -> None:
    a = base().models[0]
    d = model_to_dict(a)
    assert d["upstreams"][0]["api_key"] == "sk-up-a"
    assert parse_model(d) == a


def test_a_merge_that_breaks_a_rule_is_a_400() -> None:
    state = State().with_model("c", Entry(spec("c", "a0"), 1))  # upstream name a0 is model a's
    with pytest.raises(InvalidRequest, match="duplicate upstream name 'a0'"):
        merge(base(), state)


def test_schema_errors_carry_the_dotted_path_and_the_config_checkers_message() -> None:
    try:
        ModelSpec.model_validate({"id": "x", "upstreams": [{"url": "nope", "model": "m"}]})
    except Exception as exc:
        err = invalid(exc)  # type: ignore[arg-type]
    assert err.param == "upstreams.0.url"
    assert err.message.startswith("upstreams[0].url: 'nope' is not an http(s) URL")


def test_file_store_compare_and_set(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "s.json", audit_size=3)
    store.check_writable()

    async def run() -> None:
        s0 = await store.load()
        assert s0 == State()
        s1 = s0.with_model("x", Entry(spec("x", "x0"), 1))
        assert await store.commit(0, s1, [{"action": "one"}])
        assert not await store.commit(0, s1.with_model("y", Entry(None, 1)), [{"action": "lost"}])
        for i in range(4):
            cur = await store.load()
            assert await store.commit(cur.version, cur.with_key(f"k{i}", Entry(None, 1)), [{"action": f"k{i}"}])
        assert (await store.load()).version == 5
        assert [a["action"] for a in await store.audit(10)] == ["k3", "k2", "k1"]  # newest first, bounded

    asyncio.run(run())


def test_file_store_refuses_a_corrupt_file_at_start(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text("{nope")
    with pytest.raises(StoreError, match="cannot be read"):
        FileStore(tmp_path / "s.json").check_writable()
