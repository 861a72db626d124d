"""Choose the order in which a model's upstreams are tried.

Smooth weighted round-robin over the usable upstreams (healthy or not yet probed); the others
follow as a last resort, so a request is never refused only because a probe is stale.
Upstreams with weight 0 are drained: used only when nothing else is left.
"""

from __future__ import annotations

from gateway.domain import ModelEntry, Upstream
from gateway.routing.health import HealthBoard


class Selector:
    def __init__(self, board: HealthBoard) -> None:
        self.board = board
        self._current: dict[str, int] = {}  # smooth WRR state per upstream name

    def order(self, entry: ModelEntry) -> list[Upstream]:
        ups = entry.upstreams
        if len(ups) == 1:
            return [ups[0]]
        usable = [u for u in ups if u.weight > 0 and self.board.usable(u.name)]
        rest = [u for u in ups if u not in usable]
        if not usable:
            return rest
        first = self._pick(usable)
        return [first] + [u for u in usable if u is not first] + rest

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
