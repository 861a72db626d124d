"""Services.apply: one swap of table and keys, and the upstream listeners told what came and went."""

from __future__ import annotations

import asyncio

from gateway.app import build_services
from gateway.config import parse_config
from gateway.domain import Upstream
from gateway.settings import Settings

BASE = """
models:
  - id: a
    upstreams:
      - {name: a0, url: "http://127.0.0.1:9001", model: m, api_key: k0}
      - {name: a1, url: "http://127.0.0.1:9002", model: m}
keys:
  - {name: k1, key: sk-one-0123456789}
health: {enabled: false}
"""


def test_apply_swaps_and_reports_added_and_removed() -> None:
    cfg = parse_config(BASE, {})
    s = build_services(Settings(), cfg)
    calls: list[tuple[list[str], list[str]]] = []

    def listener(added: list[Upstream], removed: list[Upstream]) -> None:
        calls.append(([u.name for u in added], [u.name for u in removed]))

    s.upstream_listeners.append(listener)
    old_table, old_keys = s.table, s.keys
    new = parse_config(BASE.replace("weight: 1", "").replace(
        '- {name: a1, url: "http://127.0.0.1:9002", model: m}',
        '- {name: a1, url: "http://127.0.0.1:9002", model: m, weight: 0}\n      '
        '- {name: a2, url: "http://127.0.0.1:9003", model: m}').replace(
        '{name: a0, url: "http://127.0.0.1:9001", model: m, api_key: k0}',
        '{name: a0, url: "http://127.0.0.1:9001", model: m, api_key: k-new}').replace(
        "- {name: k1, key: sk-one-0123456789}", "- {name: k2, key: sk-two-0123456789}"), {})

    async def run() -> None:
        s.apply(new, 7)

    asyncio.run(run())
    # a0's key changed: a different backend (removed and added); a1's weight only: neither; a2 is new.
    assert calls == [(["a0", "a2"], ["a0"])]
    assert s.table is not old_table and s.keys is not old_keys and s.table.version == 7
    assert old_table.entries["a"].upstreams[1].weight == 1  # what in-flight requests hold is unchanged
    assert s.table.entries["a"].upstreams[1].weight == 0
    assert s.table.entries["a"].created == old_table.entries["a"].created
    assert s.config.health.enabled is False  # sections other than models/keys/admin stay the running ones
    assert s.keys.authenticate("Bearer sk-two-0123456789").name == "k2"
    assert [n for n in ("a0", "a1", "a2") if s.board.get(n).state.value == "unknown"] == ["a0", "a1", "a2"]
    assert b"gateway_config_version 7.0" in s.metrics.render()
    s.metrics.close()
