"""Usage accounting in Redis: per client key and UTC day one hash, its fields per model and hour.

    {k:<name>}:use:<YYYY-MM-DD>   field "<model>|<HH>|<req|pt|ct|rl>"   (kept 91 days)

Requests add up in memory and are written every ``interval_s`` (one pipelined HINCRBY batch, not one
Redis call per request), so a key without limits costs no Redis call on its requests. Reading ``days``
days of ``K`` keys is ``K x days`` HGETALLs in one pipeline, never a scan. Key names come from the
config: a key removed from it is no longer listed (its counters expire on their own).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta

from redis.exceptions import RedisError

from gateway.accounting import UsageRow
from gateway.ratelimit.plan import key_tag
from gateway.redis_client import AsyncRedis

log = logging.getLogger("gateway.usage")

RETENTION_S = 91 * 86400
FIELDS = ("req", "pt", "ct", "rl")


def day_key(key_name: str, day: str) -> str:
    return f"{key_tag(key_name)}:use:{day}"


class UsageRecorder:
    """Adds usage up in memory and flushes it to Redis (or nowhere, without Redis)."""

    def __init__(self, client: AsyncRedis | None, clock: Callable[[], float] = time.time,
                 interval_s: float = 2.0) -> None:
        self.client = client
        self.clock = clock
        self.interval_s = interval_s
        # (key, day) -> field -> amount
        self._pending: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self._task: asyncio.Task[None] | None = None
        self._hour_start = -float("inf")  # the UTC hour the cached names below are for
        self._day = ""
        self._hour = ""
        self._names: dict[str, tuple[str, str, str, str]] = {}  # model -> its field names this hour

    def _fields(self, key: str, model: str) -> tuple[dict[str, int], tuple[str, str, str, str]]:
        """The pending counters of ``key`` today, and ``model``'s field names this hour (cached per hour)."""
        now = self.clock()
        if not self._hour_start <= now < self._hour_start + 3600:  # UTC hours are multiples of 3600 s
            at = datetime.fromtimestamp(now, UTC)
            self._day = at.strftime("%Y-%m-%d")
            self._hour = f"{at.hour:02d}"
            self._hour_start = now - now % 3600
            self._names.clear()
        names = self._names.get(model)
        if names is None:
            prefix = f"{model}|{self._hour}|"
            names = self._names[model] = (prefix + "req", prefix + "pt", prefix + "ct", prefix + "rl")
        return self._pending[(key, self._day)], names

    def record(self, key: str, model: str, prompt: int, completion: int) -> None:
        if self.client is None:
            return
        fields, names = self._fields(key, model)
        fields[names[0]] += 1
        if prompt:
            fields[names[1]] += prompt
        if completion:
            fields[names[2]] += completion

    def refused(self, key: str, model: str) -> None:
        if self.client is None:
            return
        fields, names = self._fields(key, model)
        fields[names[3]] += 1

    async def flush(self) -> None:
        if self.client is None or not self._pending:
            return
        pending, self._pending = self._pending, defaultdict(lambda: defaultdict(int))
        pipe = self.client.pipeline(transaction=False)
        for (key, day), fields in pending.items():
            name = day_key(key, day)
            for field, amount in fields.items():
                pipe.hincrby(name, field, amount)
            pipe.expire(name, RETENTION_S)
        try:
            await pipe.execute()
        except RedisError as exc:  # keep them for the next flush
            log.warning("usage counters not written (%s); retrying later", exc)
            for k, fields in pending.items():
                for field, amount in fields.items():
                    self._pending[k][field] += amount

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.flush()

    def start(self) -> None:
        if self.client is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        try:
            async with asyncio.timeout(5):
                await self.flush()
        except TimeoutError:
            log.warning("usage counters not written at shutdown (Redis too slow)")


class RedisUsageReader:
    """The :class:`gateway.accounting.UsageReader` over the hourly counters."""

    def __init__(self, client: AsyncRedis, key_names: Callable[[], Iterable[str]],
                 clock: Callable[[], float] = time.time) -> None:
        self.client = client
        self.key_names = key_names
        self.clock = clock

    async def usage(self, days: int, key: str | None = None) -> list[UsageRow]:
        today = datetime.fromtimestamp(self.clock(), UTC).date()
        day_list = [(today - timedelta(days=d)).isoformat() for d in range(max(1, days))]
        keys = [key] if key is not None else sorted(set(self.key_names()))
        pipe = self.client.pipeline(transaction=False)
        order = [(k, d) for k in keys for d in day_list]
        for k, d in order:
            pipe.hgetall(day_key(k, d))
        results = await pipe.execute()
        rows: list[UsageRow] = []
        for (k, d), raw in zip(order, results, strict=True):
            per_model: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(FIELDS, 0))
            for f, v in (raw or {}).items():
                field = f.decode() if isinstance(f, bytes) else str(f)
                model, _hour, name = field.rsplit("|", 2)
                if name in FIELDS:
                    per_model[model][name] += int(v)
            for model in sorted(per_model):
                c = per_model[model]
                rows.append(UsageRow(d, k, model, c["req"], c["pt"], c["ct"], c["rl"]))
        rows.sort(key=lambda r: (r.day, r.key, r.model), reverse=False)
        return rows
