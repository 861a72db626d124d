"""The RateLimiter protocol: an atomic take from several buckets and gates, and the give-back after.

``acquire`` checks every item and takes from all of them or from none. ``release`` gives back: a gate
frees the request's slot, a bucket gets ``refunds[i]`` tokens back (negative: charged), kept within
``[0, capacity]``. Implementations: :mod:`.memory` (one process), :mod:`.redis_limiter` (shared).
Failures of the shared store surface as :class:`LimiterFailure`; the caller applies the fail policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from gateway.ratelimit.plan import Item


class LimiterFailure(Exception):
    """The limiter's store could not answer (down, slow, broken)."""


class Outcome(NamedTuple):  # a tuple: built once per request, cheaper than a frozen dataclass
    ok: bool
    # Per item: a bucket's level (after the take when ok, at the check otherwise); a gate's free slots.
    levels: tuple[float, ...]
    failed: int = -1  # index of the first item that refused


class RateLimiter(Protocol):
    async def acquire(self, items: Sequence[Item], costs: Sequence[int], hold: str, hold_ms: int) -> Outcome:
        """Take ``costs[i]`` from every item (a gate: one slot named ``hold`` for ``hold_ms`` at most)."""
        ...

    async def release(self, items: Sequence[Item], refunds: Sequence[int], hold: str) -> None:
        """Give back: gates free ``hold``, buckets get ``refunds[i]`` (negative charges)."""
        ...

    async def aclose(self) -> None: ...
