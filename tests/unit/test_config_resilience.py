"""Config for breakers, retries, fallbacks and `kind: openai` upstreams (check-config errors included)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gateway.config import ConfigError, parse_config


def _cfg(models: list[dict[str, Any]], **top: Any) -> str:
    return yaml.safe_dump({"models": models, **top})


def _m(mid: str, *fallbacks: str, **up: Any) -> dict[str, Any]:
    return {"id": mid, "fallbacks": list(fallbacks),
            "upstreams": [{"name": f"{mid}-u", "url": "http://127.0.0.1:9", "model": "x", **up}]}


def test_defaults() -> None:
    c = parse_config(_cfg([_m("a")]), {})
    assert (c.retry.max_attempts, c.retry.backoff_ms) == (3, 50)
    assert (c.breaker.failures, c.breaker.cool_down_s) == (5, 10)
    u = c.models[0].upstreams[0]
    assert u.kind == "vllm" and u.probe_mode == "full" and u.timeouts.connect is None


def test_openai_kind_probes_models_by_default_and_has_its_own_timeouts() -> None:
    c = parse_config(_cfg([_m("a", kind="openai", timeouts={"first_byte": 30, "connect": 2}),
                           _m("b", kind="openai", probe="passive")],
                          breaker={"failures": 2, "cool_down_s": 0.5}, retry={"max_attempts": 4, "backoff_ms": 0}), {})
    a, b = c.models[0].upstreams[0], c.models[1].upstreams[0]
    assert a.probe_mode == "models" and a.timeouts.first_byte == 30 and b.probe_mode == "passive"
    assert c.breaker.failures == 2 and c.retry.max_attempts == 4


@pytest.mark.parametrize(("models", "needle"), [
    ([_m("a", "nope")], "model 'a': fallback 'nope' is not a public model id"),
    ([_m("a", "a")], "fallback loop: a -> a"),
    ([_m("a", "b"), _m("b", "c"), _m("c", "a")], "fallback loop: a -> b -> c -> a"),
    ([_m("a", "b", "b"), _m("b")], "listed twice"),
    ([_m("a", kind="openai", launch={"model_path": "/m"})], "cannot have a `launch:` section"),
    ([_m("a", kind="cloud")], "kind"),
    ([_m("a", probe="sometimes")], "probe"),
])
def test_config_errors(models: list[dict[str, Any]], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(_cfg(models), {})
    assert needle in str(info.value), str(info.value)


def test_a_chain_without_loop_is_fine() -> None:
    c = parse_config(_cfg([_m("a", "b", "c"), _m("b", "c"), _m("c")]), {})
    assert c.models[0].fallbacks == ["b", "c"]
