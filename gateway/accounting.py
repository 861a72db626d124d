"""Usage accounting as the rest of the gateway reads it: rows of tokens and requests by key and model.

The rate-limit layer writes usage (Prometheus counters, and daily per-key-per-model counters in Redis);
readers (``gateway usage``, the admin API and page) see it through :class:`UsageReader`, so they do not
depend on where it is stored. :class:`NoUsage` is the reader when nothing is recorded (no Redis).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class UsageRow:
    day: str  # UTC date, YYYY-MM-DD
    key: str  # the client key's name (never the key)
    model: str  # the public model ID
    requests: int
    prompt_tokens: int
    completion_tokens: int
    rate_limited: int  # requests refused by a limit


class UsageReader(Protocol):
    async def usage(self, days: int, key: str | None = None) -> list[UsageRow]:
        """Rows for the last ``days`` UTC days (today included), optionally for one key."""
        ...


class NoUsage:
    """Nothing recorded: every query is valid and empty."""

    async def usage(self, days: int, key: str | None = None) -> list[UsageRow]:
        return []
