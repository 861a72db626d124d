"""Choose the order in which a model's upstreams are tried (docs/routing.md).

Candidates are the usable upstreams (``HealthBoard.usable``: healthy or not yet probed) with a weight
above 0. When the model has ``shed`` thresholds, candidates over them are set aside, and when that
leaves none, :class:`~gateway.errors.ModelOverloaded` is raised before anything is sent. Then:

- affinity: a request with a session key goes first to the rendezvous-hash winner among the candidates;
- the model's strategy orders the (other) candidates:
  ``weighted`` smooth weighted round-robin, ``least_outstanding`` fewest of this instance's requests in
  flight (ties at random), ``load_aware`` lowest score from the last ``/metrics`` scrape plus the
  requests sent since (stale or failing metrics: saturated; among equals, fewest in flight, then random);
- the rest follows as a last resort (over the shed thresholds, then unusable or drained), so a request
  is never refused only because a probe or a scrape is stale.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from gateway.domain import ModelEntry, Upstream
from gateway.errors import ModelOverloaded
from gateway.routing import affinity
from gateway.routing.health import HealthBoard
from gateway.routing.load import LoadBoard


class Selector:
    def __init__(self, board: HealthBoard, load: LoadBoard | None = None, rng: random.Random | None = None) -> None:
        self.board = board
        self.load = load if load is not None else LoadBoard()
        self.rng = rng or random.Random()
        self._current: dict[str, int] = {}  # smooth WRR state per upstream name
        self.on_shed: Callable[[ModelEntry], None] | None = None  # a request refused as model_overloaded

    def order(self, entry: ModelEntry, affinity_key: str | None = None) -> list[Upstream]:
        ups = entry.upstreams
        if len(ups) == 1 and entry.shed is None:
            return [ups[0]]
        usable = [u for u in ups if u.weight > 0 and self.board.usable(u.name)]
        over: list[Upstream] = []
        if entry.shed is not None and usable:
            shed = entry.shed
            over = [u for u in usable if self.load.over(u.name, shed)]
            if len(over) == len(usable):
                if self.on_shed is not None:
                    self.on_shed(entry)
                raise ModelOverloaded(
                    f"The model `{entry.id}` is overloaded: every backend is over its queue or cache "
                    f"limit. Retry shortly.",
                    detail=f"shed: all of {', '.join(u.name for u in usable)} over {shed!r}",
                )
            if over:
                usable = [u for u in usable if not any(u is o for o in over)]
        if len(usable) + len(over) == len(ups):
            rest: list[Upstream] = []
        else:
            taken = {id(u) for u in usable} | {id(u) for u in over}
            rest = [u for u in ups if id(u) not in taken]
        if not usable:
            return rest
        if affinity_key is not None and len(usable) > 1:
            sticky = affinity.pick(affinity_key, usable)
            others = [u for u in usable if u is not sticky]
            return [sticky, *self._ordered(entry.routing, others, advance=False), *over, *rest]
        return self._ordered(entry.routing, usable, advance=True) + over + rest

    def _ordered(self, routing: str, ups: list[Upstream], advance: bool) -> list[Upstream]:
        if len(ups) <= 1:
            return ups
        if routing == "least_outstanding":
            load = self.load
            return sorted(ups, key=lambda u: (load.in_flight(u.name), self.rng.random()))
        if routing == "load_aware":
            rnd = self.rng.random
            keyed = [(score, n, rnd(), i) for i, (score, n) in enumerate(self.load.ranking([u.name for u in ups]))]
            keyed.sort()
            return [ups[k[3]] for k in keyed]
        if not advance:
            return ups
        first = self._pick(ups)
        return [first] + [u for u in ups if u is not first]

    def _pick(self, ups: list[Upstream]) -> Upstream:
        total = 0
        best: Upstream | None = None
        best_score = 0
        for u in ups:
            score = self._current.get(u.name, 0) + u.weight
            self._current[u.name] = score
            total += u.weight
            if best is None or score > best_score:
                best, best_score = u, score
        assert best is not None
        self._current[best.name] -= total
        return best
