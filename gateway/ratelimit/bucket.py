"""Token-bucket arithmetic on plain numbers (milliseconds, tokens); no I/O, no clock of its own.

A bucket is ``(level, ts)``: ``level`` tokens at time ``ts``. It refills continuously at ``rate`` tokens
per millisecond up to ``capacity``; an absent bucket is full. ``scripts.lua`` does the same in Redis.
"""

from __future__ import annotations


def level_at(level: float, ts: float, now: float, capacity: float, rate: float) -> float:
    """The level at ``now`` (never above capacity; a clock that goes back refills nothing)."""
    if now <= ts:
        return min(capacity, level)
    return min(capacity, level + (now - ts) * rate)


def adjust(level: float, delta: float, capacity: float) -> float:
    """Give back (delta > 0) or charge (delta < 0), kept within ``[0, capacity]``."""
    return max(0.0, min(capacity, level + delta))


def wait_ms(level: float, cost: float, rate: float) -> float:
    """Milliseconds until ``cost`` fits, starting from ``level``."""
    if level >= cost:
        return 0.0
    return (cost - level) / rate if rate > 0 else float("inf")


def full_in_ms(level: float, capacity: float, rate: float) -> float:
    """Milliseconds until the bucket is full again."""
    return max(0.0, capacity - level) / rate if rate > 0 else 0.0
