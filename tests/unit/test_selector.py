from __future__ import annotations

from collections import Counter

from gateway.config.schema import UpstreamSpec
from gateway.domain import ModelEntry, Upstream
from gateway.routing.health import HealthBoard
from gateway.routing.probe import ProbeResult, ProbeState
from gateway.routing.selector import Selector


def _entry(*weights: int) -> ModelEntry:
    ups = tuple(
        Upstream.from_spec("m", UpstreamSpec(name=f"u{i}", url=f"http://127.0.0.1:{9000 + i}", model="x", weight=w))
        for i, w in enumerate(weights)
    )
    return ModelEntry("m", ups, "me", 0)


def test_weighted_round_robin_and_failover_order() -> None:
    entry = _entry(2, 1)
    sel = Selector(HealthBoard(u.name for u in entry.upstreams))
    firsts = Counter(sel.order(entry)[0].name for _ in range(300))
    assert firsts == {"u0": 200, "u1": 100}
    order = sel.order(entry)
    assert sorted(u.name for u in order) == ["u0", "u1"]


def test_unhealthy_go_last_and_drained_only_as_last_resort() -> None:
    entry = _entry(1, 1, 0)
    board = HealthBoard(u.name for u in entry.upstreams)
    sel = Selector(board)
    board.set("u0", ProbeResult(ProbeState.DOWN, "refused"))
    for _ in range(5):
        assert [u.name for u in sel.order(entry)] == ["u1", "u0", "u2"]
    board.set("u1", ProbeResult(ProbeState.KEY_MISMATCH, "401"))
    assert [u.name for u in sel.order(entry)] == ["u0", "u1", "u2"]
