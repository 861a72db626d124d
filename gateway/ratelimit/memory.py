"""The in-memory RateLimiter: exact within one process, with an injected clock (milliseconds).

Two ways in. ``acquire``/``release`` (the RateLimiter protocol: any items, any costs) loop over the
items. ``take``/``give`` (what the rate-limit service calls on the request path) run a *program*:
straight-line code generated once per item list (a plan's), with each bucket's and gate's state bound
as closure variables and each item's cost known in advance (the token estimate for a tokens bucket,
1 otherwise), so a request pays for no loop, no tuple unpacking and no costs tuple. Both paths share
the same state and the same arithmetic (``bucket.py``); a property test runs them side by side.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from gateway.ratelimit.limiter import Outcome
from gateway.ratelimit.plan import Item

# A resolved item: (is a gate, its holds or its [level, ts] cell, capacity, rate per ms)
_Cell = tuple[bool, Any, int, float]


def monotonic_ms() -> float:
    return time.monotonic() * 1000.0


class MemoryLimiter:
    """Same contract as the Redis limiter; each process (worker) has its own buckets.

    A bucket is a mutable cell ``[level, ts]`` (a new one is full), a gate a dict of holds and
    their expiry. An item list (a plan's) is resolved to its cells once and kept, so a request does
    no lookups by name; expired holds are dropped only when they would make a gate refuse.
    """

    def __init__(self, clock: Callable[[], float] = monotonic_ms) -> None:
        self.clock = clock
        self._buckets: dict[str, list[float]] = {}  # key -> [level, ts]
        self._gates: dict[str, dict[Hashable, float]] = {}  # key -> {hold: expiry}
        self._resolved: dict[int, tuple[Sequence[Item], tuple[_Cell, ...]]] = {}
        self._programs: dict[int, tuple[Sequence[Item], Program]] = {}

    def _cells(self, items: Sequence[Item]) -> tuple[_Cell, ...]:
        got = self._resolved.get(id(items))
        if got is not None and got[0] is items:
            return got[1]
        cells: list[_Cell] = []
        for item in items:
            if item.kind == "parallel":
                holds = self._gates.setdefault(item.key, {})
                cells.append((True, holds, item.capacity, 0.0))
            else:
                # a new bucket is full; ts = inf: no refill is added before its first take sets ts
                cell = self._buckets.setdefault(item.key, [float(item.capacity), math.inf])
                cells.append((False, cell, item.capacity, item.rate))
        if len(self._resolved) >= 4096:  # item lists of plans that no longer exist (config reloads)
            self._resolved.clear()
        out = tuple(cells)
        self._resolved[id(items)] = (items, out)
        return out

    def program(self, items: Sequence[Item]) -> Program:
        """The compiled take/give of this item list (built on first use, then cached)."""
        got = self._programs.get(id(items))
        if got is not None and got[0] is items:
            return got[1]
        prog = compile_program(items, self._cells(items), self.clock)
        if len(self._programs) >= 4096:
            self._programs.clear()
        self._programs[id(items)] = (items, prog)
        return prog

    def acquire_now(self, items: Sequence[Item], costs: Sequence[int], hold: str, hold_ms: int) -> Outcome:
        """``acquire`` without the coroutine: nothing here waits (the rate-limit service calls this)."""
        now = self.clock()
        cells = self._cells(items)
        levels: list[float] = []
        i = 0
        for gate, state, cap, rate in cells:
            cost = costs[i]
            if gate:
                holds = state
                if cap - len(holds) < cost:
                    for h in [h for h, exp in holds.items() if exp <= now]:
                        del holds[h]
                level = float(cap - len(holds))
            else:
                cell = state
                level = cell[0]
                if now > cell[1]:
                    level += (now - cell[1]) * rate
                if level > cap:
                    level = float(cap)
            levels.append(level)
            if level < cost:
                return Outcome(False, tuple(levels), i)
            i += 1
        i = 0
        for gate, state, _cap, _rate in cells:
            if gate:
                state[hold] = now + hold_ms
                levels[i] -= 1
            else:
                cell = state
                cell[0] = levels[i] = levels[i] - costs[i]
                cell[1] = now
            i += 1
        return Outcome(True, tuple(levels))

    async def acquire(self, items: Sequence[Item], costs: Sequence[int], hold: str, hold_ms: int) -> Outcome:
        if len(items) != len(costs):
            raise ValueError("one cost per item")
        return self.acquire_now(items, costs, hold, hold_ms)

    def release_now(self, items: Sequence[Item], refunds: Sequence[int], hold: str) -> None:
        now = self.clock()
        i = 0
        for gate, state, cap, rate in self._cells(items):
            if gate:
                state.pop(hold, None)
            elif refunds[i]:  # bucket.level_at and bucket.adjust, inline
                cell = state
                level = cell[0]
                if now > cell[1]:
                    level += (now - cell[1]) * rate
                if level > cap:
                    level = float(cap)
                level += refunds[i]
                cell[0] = float(cap) if level > cap else (0.0 if level < 0.0 else level)
                cell[1] = now
            i += 1

    async def release(self, items: Sequence[Item], refunds: Sequence[int], hold: str) -> None:
        if len(items) != len(refunds):
            raise ValueError("one refund per item")
        self.release_now(items, refunds, hold)

    async def aclose(self) -> None:
        return None


# take(estimate, hold, hold_ms) -> Outcome; give(delta, hold): free the gates, return `delta` tokens
Take = Callable[[int, Hashable, int], Outcome]
Give = Callable[[int, Hashable], None]


class Program:
    __slots__ = ("give", "source", "take")

    def __init__(self, take: Take, give: Give, source: str) -> None:
        self.take = take
        self.give = give
        self.source = source  # the generated code, for tests and for a reader


def compile_program(items: Sequence[Item], cells: Sequence[_Cell], clock: Callable[[], float]) -> Program:
    """Generate ``take`` and ``give`` for these items: the loops of ``acquire_now``/``release_now``
    unrolled, with item i's state as closure variable ``s<i>`` and its capacity and rate as constants."""
    take = ["    def take(est, hold, hold_ms):", "        now = clock()"]
    commit: list[str] = []
    give = ["    def give(delta, hold):"]
    refund: list[str] = []
    names: list[str] = []
    for i, (item, (gate, _state, cap, rate)) in enumerate(zip(items, cells, strict=True)):
        s, lv, fcap = f"s{i}", f"l{i}", repr(float(cap))
        names.append(s)
        so_far = "(" + "".join(f"l{j}, " for j in range(i + 1)) + ")"
        if gate:
            take += [f"        {lv} = {fcap} - len({s})",
                     f"        if {lv} < 1.0:",
                     f"            for h in [h for h, exp in {s}.items() if exp <= now]:",
                     f"                del {s}[h]",
                     f"            {lv} = {fcap} - len({s})",
                     f"            if {lv} < 1.0:",
                     f"                return Outcome(False, {so_far}, {i})"]
            commit += [f"        {s}[hold] = now + hold_ms", f"        {lv} -= 1.0"]
            give.append(f"        {s}.pop(hold, None)")
            continue
        cost = "est" if item.kind == "tokens" else "1"
        take += [f"        {lv} = {s}[0]",
                 f"        if now > {s}[1]:",
                 f"            {lv} += (now - {s}[1]) * {rate!r}",
                 f"        if {lv} > {fcap}:",
                 f"            {lv} = {fcap}",
                 f"        if {lv} < {cost}:",
                 f"            return Outcome(False, {so_far}, {i})"]
        commit += [f"        {s}[0] = {lv} = {lv} - {cost}", f"        {s}[1] = now"]
        if item.kind == "tokens":  # the reconciliation touches tokens buckets only
            refund += [f"            lv = {s}[0]",
                       f"            if now > {s}[1]:",
                       f"                lv += (now - {s}[1]) * {rate!r}",
                       f"            if lv > {fcap}:",
                       f"                lv = {fcap}",
                       "            lv += delta",
                       f"            {s}[0] = {fcap} if lv > {fcap} else (0.0 if lv < 0.0 else lv)",
                       f"            {s}[1] = now"]
    levels = "(" + "".join(f"l{j}, " for j in range(len(cells))) + ")"
    take += [*commit, f"        return Outcome(True, {levels})"]
    if refund:
        give += ["        if delta:", "            now = clock()", *refund]
    elif len(give) == 1:
        give.append("        return None")
    source = "\n".join([f"def make({', '.join(names)}):", *take, *give, "    return take, give"])
    namespace: dict[str, Any] = {"clock": clock, "Outcome": Outcome}
    exec(compile(source, f"<rate-limit program {items[0].key if items else ''}>", "exec"), namespace)
    made = namespace["make"](*(state for _gate, state, _cap, _rate in cells))
    return Program(made[0], made[1], source)
