"""Load routing as pure code: LoadBoard scores and staleness, strategies, shedding, rendezvous affinity."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from gateway.config.schema import ShedSpec, UpstreamSpec
from gateway.domain import ModelEntry, Upstream
from gateway.errors import ModelOverloaded
from gateway.routing import affinity
from gateway.routing.health import HealthBoard
from gateway.routing.load import SATURATED, LoadBoard, Scrape
from gateway.routing.probe import ProbeResult, ProbeState
from gateway.routing.selector import Selector


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _ups(n: int, weights: tuple[int, ...] | None = None) -> tuple[Upstream, ...]:
    return tuple(
        Upstream.from_spec("m", UpstreamSpec(name=f"u{i}", url=f"http://127.0.0.1:{9000 + i}", model="x",
                                             weight=1 if weights is None else weights[i]))
        for i in range(n)
    )


def _entry(n: int, routing: str = "weighted", shed: ShedSpec | None = None,
           ups: tuple[Upstream, ...] | None = None) -> ModelEntry:
    return ModelEntry("m", ups or _ups(n), "me", 0, routing=routing, shed=shed)


def _setup(n: int, routing: str, shed: ShedSpec | None = None, seed: int = 1
           ) -> tuple[ModelEntry, HealthBoard, LoadBoard, Clock, Selector]:
    entry = _entry(n, routing, shed)
    clock = Clock()
    load = LoadBoard(stale_s=3.0, clock=clock)
    load.add(u.name for u in entry.upstreams)
    board = HealthBoard(u.name for u in entry.upstreams)
    return entry, board, load, clock, Selector(board, load, random.Random(seed))


def _scrape(load: LoadBoard, clock: Clock, name: str, running: float = 0, waiting: float = 0,
            kv: float = 0.0) -> None:
    load.record(name, Scrape(running=running, waiting=waiting, kv_usage=kv, at=clock.t))


def _names(ups: list[Upstream]) -> list[str]:
    return [u.name for u in ups]


# ---------------------------------------------------------------- LoadBoard


def test_score_from_scrape_plus_requests_sent_since() -> None:
    clock = Clock()
    load = LoadBoard(stale_s=3.0, clock=clock)
    load.add(["a"])
    assert load.score("a") == SATURATED  # never scraped: nothing known, no preference for it
    _scrape(load, clock, "a", running=3, waiting=2, kv=0.5)
    assert load.score("a") == 3 + 2 * 2 + 8 * 0.5
    first = load.start("a")
    second = load.start("a")
    assert load.score("a") == 11 + 2 and load.in_flight("a") == 2
    _scrape(load, clock, "a", running=5)  # the new scrape includes both: they no longer add
    assert load.score("a") == 5 and load.in_flight("a") == 2
    third = load.start("a")
    first.release()  # started before the scrape: leaves in-flight, not the since-scrape count
    first.release()  # idempotent
    assert load.score("a") == 6 and load.in_flight("a") == 2
    third.release()
    second.release()
    assert load.score("a") == 5 and load.in_flight("a") == 0


def test_stale_or_failing_metrics_are_saturated() -> None:
    clock = Clock()
    load = LoadBoard(stale_s=3.0, clock=clock)
    load.add(["a"])
    _scrape(load, clock, "a", running=1)
    clock.t += 2.9
    assert load.score("a") == 1
    clock.t += 0.2
    assert load.score("a") == SATURATED
    _scrape(load, clock, "a", running=1)
    assert load.score("a") == 1
    load.record_failure("a", "connection refused")
    assert load.score("a") == SATURATED and load.failing("a") == "connection refused"


def test_over_shed_thresholds() -> None:
    clock = Clock()
    load = LoadBoard(stale_s=3.0, clock=clock)
    load.add(["a"])
    shed = ShedSpec(max_waiting=4, max_kv_usage=0.9)
    assert not load.over("a", shed)  # never scraped: nothing known against it
    _scrape(load, clock, "a", waiting=3, kv=0.89)
    assert not load.over("a", shed)
    _scrape(load, clock, "a", waiting=4, kv=0.0)
    assert load.over("a", shed)
    _scrape(load, clock, "a", waiting=0, kv=0.9)
    assert load.over("a", shed)
    assert not load.over("a", ShedSpec(max_waiting=4))  # only the thresholds that are set count
    _scrape(load, clock, "a")
    clock.t += 3.5
    assert load.over("a", shed)  # stale: saturated
    _scrape(load, clock, "a")
    load.record_failure("a", "500")
    assert load.over("a", shed)


def test_membership_changes_at_run_time() -> None:
    load = LoadBoard()
    load.set_upstreams(["a", "b"])
    lease = load.start("b")
    load.set_upstreams(["a", "c"])
    assert sorted(load.names()) == ["a", "c"]
    lease.release()  # on a removed upstream: harmless
    assert load.in_flight("b") == 0
    load.record("b", Scrape(1, 1, 0.1, 0.0))  # a scrape landing after removal is dropped
    assert "b" not in load.names()


# ---------------------------------------------------------------- strategies


def test_least_outstanding_picks_fewest_in_flight_ties_random() -> None:
    entry, _, load, _, sel = _setup(3, "least_outstanding")
    held = [load.start("u0"), load.start("u0"), load.start("u1")]
    assert [_names(sel.order(entry))[0] for _ in range(20)] == ["u2"] * 20
    assert _names(sel.order(entry)) == ["u2", "u1", "u0"]
    held[0].release()
    held[1].release()  # u0 and u2 now tie at 0: both get picked
    firsts = Counter(_names(sel.order(entry))[0] for _ in range(200))
    assert set(firsts) == {"u0", "u2"} and min(firsts.values()) > 60


def test_least_outstanding_follows_leases_through_a_burst() -> None:
    entry, _, load, _, sel = _setup(4, "least_outstanding")
    leases = [load.start(sel.order(entry)[0].name) for _ in range(40)]
    assert Counter(lease.name for lease in leases) == {"u0": 10, "u1": 10, "u2": 10, "u3": 10}


def test_load_aware_lowest_score_wins() -> None:
    entry, _, load, clock, sel = _setup(3, "load_aware")
    _scrape(load, clock, "u0", running=2, waiting=5)
    _scrape(load, clock, "u1", running=2, kv=0.5)
    _scrape(load, clock, "u2", running=1, waiting=3)
    assert _names(sel.order(entry)) == ["u1", "u2", "u0"]  # 6 < 7 < 12
    for _ in range(3):  # three requests sent to u1 since its scrape: 9 > 7
        load.start("u1")
    assert _names(sel.order(entry)) == ["u2", "u1", "u0"]


def test_load_aware_stale_backend_goes_last_and_all_stale_falls_back_to_in_flight() -> None:
    entry, _, load, clock, sel = _setup(3, "load_aware")
    _scrape(load, clock, "u0", running=50, waiting=40)
    _scrape(load, clock, "u2", running=1)
    clock.t += 2
    _scrape(load, clock, "u1", running=0)
    clock.t += 1.5  # u0, u2 stale; u1 fresh
    assert _names(sel.order(entry))[0] == "u1"
    load.record_failure("u1", "timed out")
    clock.t += 10  # everything stale: fewest in flight first
    load.start("u0")
    load.start("u1")
    assert _names(sel.order(entry))[0] == "u2"


def test_weighted_is_todays_smooth_round_robin() -> None:
    entry = _entry(2, ups=_ups(2, (2, 1)))
    sel = Selector(HealthBoard(u.name for u in entry.upstreams))
    assert Counter(_names(sel.order(entry))[0] for _ in range(300)) == {"u0": 200, "u1": 100}


def test_unusable_and_drained_go_last_in_every_strategy() -> None:
    for routing in ("least_outstanding", "load_aware"):
        entry = _entry(3, routing, ups=_ups(3, (1, 1, 0)))
        board = HealthBoard(u.name for u in entry.upstreams)
        sel = Selector(board, LoadBoard())
        board.set("u0", ProbeResult(ProbeState.DOWN, "refused"))
        assert _names(sel.order(entry)) == ["u1", "u0", "u2"]


# ---------------------------------------------------------------- shedding


def test_shed_sets_over_backends_aside_then_refuses_when_all_are_over() -> None:
    shed = ShedSpec(max_waiting=10, max_kv_usage=0.95)
    entry, board, load, clock, sel = _setup(3, "weighted", shed)
    shed_seen: list[str] = []
    sel.on_shed = lambda e: shed_seen.append(e.id)
    _scrape(load, clock, "u0", waiting=10)
    _scrape(load, clock, "u1", kv=0.97)
    _scrape(load, clock, "u2", waiting=9, kv=0.5)
    for _ in range(5):
        assert _names(sel.order(entry)) == ["u2", "u0", "u1"]  # the over ones only as retry targets
    board.set("u2", ProbeResult(ProbeState.DOWN, "refused"))  # the only one under is down
    with pytest.raises(ModelOverloaded) as info:
        sel.order(entry)
    err = info.value
    assert (err.status, err.code, err.retry_after_s) == (503, "model_overloaded", 1)
    assert (b"retry-after", b"1") in err.policy_headers()
    assert "u0" not in err.message and "127.0.0.1" not in err.message  # no backend names or URLs for clients
    assert shed_seen == ["m"]


def test_shed_with_a_single_backend_and_stale_metrics() -> None:
    entry, _, load, clock, sel = _setup(1, "weighted", ShedSpec(max_waiting=2))
    assert _names(sel.order(entry)) == ["u0"]  # not scraped yet: optimistic
    _scrape(load, clock, "u0", waiting=1)
    assert _names(sel.order(entry)) == ["u0"]
    clock.t += 4  # stale: saturated
    with pytest.raises(ModelOverloaded):
        sel.order(entry)


# ---------------------------------------------------------------- affinity


def test_affinity_sticks_and_only_the_removed_backends_keys_move() -> None:
    ups = _ups(5)
    keys = [f"session-{i}" for i in range(2000)]
    before = {k: affinity.pick(k, ups).name for k in keys}
    assert min(Counter(before.values()).values()) > 300  # spread over all five
    remaining = tuple(u for u in ups if u.name != "u2")
    after = {k: affinity.pick(k, remaining).name for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(before[k] == "u2" for k in moved)  # only u2's share moved
    assert len(moved) == Counter(before.values())["u2"]
    assert set(Counter(after[k] for k in moved)) == {"u0", "u1", "u3", "u4"}  # ... spread over the rest
    assert affinity.rank("session-7", ups)[0].name == before["session-7"]


def test_weighted_rendezvous_follows_weights() -> None:
    ups = _ups(2, (3, 1))
    share = Counter(affinity.pick(f"k{i}", ups).name for i in range(4000))
    assert 2800 < share["u0"] < 3200


def test_selector_affinity_respects_health_and_shed() -> None:
    shed = ShedSpec(max_waiting=5)
    entry, board, load, clock, sel = _setup(4, "load_aware", shed)
    for u in entry.upstreams:
        _scrape(load, clock, u.name)
    sticky = affinity.pick("conv-1", entry.upstreams).name
    _scrape(load, clock, sticky, running=30)  # heavier than the others, but affinity wins
    assert all(_names(sel.order(entry, "conv-1"))[0] == sticky for _ in range(10))
    _scrape(load, clock, sticky, waiting=5)  # over the shed thresholds: goes elsewhere meanwhile
    runner_up = _names(affinity.rank("conv-1", entry.upstreams))[1]
    assert _names(sel.order(entry, "conv-1"))[0] == runner_up
    _scrape(load, clock, sticky)
    board.set(sticky, ProbeResult(ProbeState.DOWN, "refused"))
    assert _names(sel.order(entry, "conv-1"))[0] == runner_up
    board.set(sticky, ProbeResult(ProbeState.OK, "ok"))
    assert _names(sel.order(entry, "conv-1"))[0] == sticky  # back when it is usable again


@pytest.mark.parametrize(("source", "headers", "payload", "key"), [
    ("header:x-session-id", [(b"X-Session-Id", b" abc ")], {}, "abc"),
    ("header:x-session-id", [(b"x-other", b"abc")], {}, None),
    ("header:x-session-id", [(b"x-session-id", b"")], {}, None),
    ("user", [], {"user": "alice"}, "alice"),
    ("user", [], {"user": 5}, None),
    ("user", [], {"metadata": {"user_id": "bob"}}, "bob"),  # Anthropic's field
    (None, [(b"x-session-id", b"abc")], {"user": "alice"}, None),
])
def test_affinity_key_extraction(source: str | None, headers: list[tuple[bytes, bytes]],
                                 payload: dict[str, object], key: str | None) -> None:
    assert affinity.affinity_key(source, headers, payload) == key


def test_ranking_agrees_with_score_and_in_flight() -> None:
    clock = Clock()
    load = LoadBoard(stale_s=3.0, clock=clock)
    load.add(["a", "b", "c", "d"])
    _scrape(load, clock, "a", running=1, waiting=2, kv=0.25)
    _scrape(load, clock, "b", running=3)
    load.record_failure("b", "500")
    clock.t += 1
    _scrape(load, clock, "c")
    load.start("a")
    load.start("c")
    clock.t += 2.5  # a's scrape is now stale, c's is not
    names = ["a", "b", "c", "d", "never-added"]
    assert load.ranking(names) == [(load.score(n), load.in_flight(n)) for n in names]
    assert load.ranking(names) == [(SATURATED, 1), (SATURATED, 0), (1.0, 1), (SATURATED, 0), (SATURATED, 0)]
