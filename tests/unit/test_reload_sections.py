"""What a reload applies and which changed sections it leaves for a restart (gateway.config.live)."""

from __future__ import annotations

from typing import Any

import yaml

from gateway.config import parse_config
from gateway.config.live import live_update, restart_sections
from gateway.config.schema import GatewayConfig


def _cfg(**top: Any) -> GatewayConfig:
    base: dict[str, Any] = {
        "models": [{"id": "m", "upstreams": [{"url": "http://127.0.0.1:8001", "model": "x"}]}],
        "keys": [{"name": "k", "key": "sk-test-0123456789"}],
        "admin": {"keys": [{"name": "ops", "key_sha256": "ab" * 32}]},
    }
    base.update(top)
    return parse_config(yaml.safe_dump(base), {})


def test_models_keys_and_admin_keys_are_live() -> None:
    running = _cfg()
    assert restart_sections(running, _cfg()) == []
    assert restart_sections(running, _cfg(
        models=[{"id": "other", "upstreams": [{"url": "http://127.0.0.1:8002", "model": "y"}]}],
        keys=[{"name": "k2", "key": "sk-test-abcdefghijkl", "rpm": 5}],
        admin={"keys": [{"name": "ops2", "key_sha256": "cd" * 32}]})) == []


def test_every_other_section_is_named_in_file_order() -> None:
    running = _cfg()
    changed = _cfg(routing={"metrics_stale_s": 9}, timeouts={"idle": 5}, retry={"max_attempts": 1},
                   admin={"keys": [{"name": "ops", "key_sha256": "ab" * 32}], "audit_size": 10})
    assert restart_sections(running, changed) == ["timeouts", "retry", "admin", "routing"]


def test_the_swap_takes_exactly_the_live_parts() -> None:
    running = _cfg()
    new = _cfg(timeouts={"idle": 5},
               admin={"keys": [{"name": "ops2", "key_sha256": "cd" * 32}], "audit_size": 10},
               models=[{"id": "other", "upstreams": [{"url": "http://127.0.0.1:8002", "model": "y"}]}])
    swapped = live_update(running, new)
    assert [m.id for m in swapped.models] == ["other"] and [k.name for k in swapped.admin.keys] == ["ops2"]
    assert swapped.timeouts == running.timeouts and swapped.admin.audit_size == running.admin.audit_size
    assert restart_sections(swapped, new) == ["timeouts", "admin"]
