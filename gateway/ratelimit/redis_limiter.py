"""The Redis RateLimiter: one Lua script checks and takes from every bucket and gate, all or nothing.

The clock is Redis ``TIME`` (instances with skewed clocks agree); buckets are hashes ``{v, t}`` with a
TTL of "until full again" (an expired bucket is a full one), gates are sorted sets of holds scored by
their expiry (a crashed instance's holds lapse). Scripts go through redis-py ``register_script``:
EVALSHA, and SCRIPT LOAD again on NOSCRIPT (after a Redis restart or ``SCRIPT FLUSH``).

On a Redis Cluster a Lua script may touch one slot only. A key's items share the hash tag
``{k:<name>}``; model-wide items live under ``{m:<model>}``. Then the two groups go as two scripts,
sent together, and the group that succeeded is given back when the other refused: limits are never
exceeded, but while that refund is in flight a concurrent request may be refused that would have fit.

On a standalone Redis reached over TCP the scripts go through :mod:`.resp` instead of redis-py (the
same scripts, EVALSHA and NOSCRIPT reload, about a tenth of the CPU): each item list's command is
encoded once, and a request adds only its hold and its costs. Gives-back go out without a task
(``release_nowait``), written together with whatever else the event loop sends in that iteration.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from hashlib import sha1

from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import Connection
from redis.exceptions import RedisError

from gateway.ratelimit.limiter import LimiterFailure, Outcome
from gateway.ratelimit.plan import Item
from gateway.ratelimit.resp import Reply, RespClient, RespError, bulk, command
from gateway.redis_client import AsyncRedis

# KEYS: the items. ARGV: hold, hold_ms, then per item: kind ("b" bucket, "p" gate), capacity, rate/ms, cost.
# Returns {ok, failed index (0 when ok), level per item as strings}.
ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local hold, hold_ms = ARGV[1], tonumber(ARGV[2])
local n = #KEYS
local levels = {}
for i = 1, n do
  local a = 2 + (i - 1) * 4
  local cap, rate, cost = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local level
  if ARGV[a + 1] == 'p' then
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
    level = cap - redis.call('ZCARD', KEYS[i])
  else
    local s = redis.call('HMGET', KEYS[i], 'v', 't')
    level = cap
    if s[1] then
      level = tonumber(s[1])
      local dt = now - tonumber(s[2])
      if dt > 0 then level = level + dt * rate end
      if level > cap then level = cap end
    end
  end
  levels[i] = level
  if level < cost then
    local out = {0, i}
    for j = 1, i do out[j + 2] = tostring(levels[j]) end
    return out
  end
end
local out = {1, 0}
for i = 1, n do
  local a = 2 + (i - 1) * 4
  local cap, rate, cost = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local level = levels[i] - cost
  if ARGV[a + 1] == 'p' then
    redis.call('ZADD', KEYS[i], now + hold_ms, hold)
    redis.call('PEXPIRE', KEYS[i], hold_ms + 1000)
  else
    redis.call('HSET', KEYS[i], 'v', tostring(level), 't', now)
    redis.call('PEXPIRE', KEYS[i], math.ceil((cap - level) / rate) + 1000)
  end
  out[i + 2] = tostring(level)
end
return out
"""

# KEYS: the items. ARGV: hold, then per item: kind, capacity, rate/ms, refund (negative: charge).
RELEASE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local hold = ARGV[1]
for i = 1, #KEYS do
  local a = 1 + (i - 1) * 4
  local cap, rate, refund = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  if ARGV[a + 1] == 'p' then
    redis.call('ZREM', KEYS[i], hold)
  elseif refund ~= 0 then
    local s = redis.call('HMGET', KEYS[i], 'v', 't')
    local level = cap
    if s[1] then
      level = tonumber(s[1])
      local dt = now - tonumber(s[2])
      if dt > 0 then level = level + dt * rate end
      if level > cap then level = cap end
    end
    level = level + refund
    if level > cap then level = cap end
    if level < 0 then level = 0 end
    redis.call('HSET', KEYS[i], 'v', tostring(level), 't', now)
    redis.call('PEXPIRE', KEYS[i], math.ceil((cap - level) / rate) + 1000)
  end
end
return 1
"""


def _args(items: Sequence[Item], amounts: Sequence[int]) -> list[str | int | float]:
    out: list[str | int | float] = []
    for item, amount in zip(items, amounts, strict=True):
        out += ("p" if item.kind == "parallel" else "b", item.capacity, repr(item.rate), amount)
    return out


def lean_client(client: AsyncRedis) -> RespClient | None:
    """A :class:`RespClient` to the same standalone Redis as ``client`` (plain TCP only), else None."""
    if isinstance(client, RedisCluster):
        return None
    pool = client.connection_pool
    if pool.connection_class is not Connection:  # TLS, unix socket: redis-py does it
        return None
    kw = pool.connection_kwargs
    return RespClient(str(kw.get("host") or "localhost"), int(kw.get("port") or 6379), int(kw.get("db") or 0),
                      kw.get("username"), kw.get("password"), float(kw.get("socket_connect_timeout") or 5.0),
                      float(kw.get("socket_timeout") or 5.0))


_B1 = bulk(b"1")
_B0 = bulk(b"0")
_SHA = {name: sha1(body.encode()).hexdigest().encode() for name, body in (("a", ACQUIRE), ("r", RELEASE))}


def _amount(n: int) -> bytes:
    if n == 1:
        return _B1
    if n == 0:
        return _B0
    v = b"%d" % n
    return b"$%d\r\n%s\r\n" % (len(v), v)


class _Encoded:
    """An item list's EVALSHA commands, encoded once: what comes before the hold, and per item
    (kind, capacity, rate) before its amount."""

    __slots__ = ("acquire_head", "items", "release_head", "statics")

    def __init__(self, items: Sequence[Item]) -> None:
        self.items = items
        keys = b"".join(bulk(i.key.encode()) for i in items)
        n = len(items)
        nk = bulk(b"%d" % n)
        self.acquire_head = b"*%d\r\n" % (3 + n + 2 + 4 * n) + bulk(b"EVALSHA") + bulk(_SHA["a"]) + nk + keys
        self.release_head = b"*%d\r\n" % (3 + n + 1 + 4 * n) + bulk(b"EVALSHA") + bulk(_SHA["r"]) + nk + keys
        self.statics = tuple(bulk(b"p" if i.kind == "parallel" else b"b") + bulk(b"%d" % i.capacity)
                             + bulk(repr(i.rate).encode()) for i in items)

    def acquire(self, costs: Sequence[int], hold: str, hold_ms: int) -> bytes:
        parts = [self.acquire_head, bulk(hold.encode()), _amount(hold_ms)]
        for static, cost in zip(self.statics, costs, strict=True):
            parts.append(static)
            parts.append(_amount(cost))
        return b"".join(parts)

    def release(self, refunds: Sequence[int], hold: str) -> bytes:
        parts = [self.release_head, bulk(hold.encode())]
        for static, refund in zip(self.statics, refunds, strict=True):
            parts.append(static)
            parts.append(_amount(refund))
        return b"".join(parts)


def _noscript(reply: Reply) -> bool:
    return isinstance(reply, RespError) and str(reply).startswith("NOSCRIPT")


class RedisLimiter:
    def __init__(self, client: AsyncRedis, clustered: bool, lean: bool = True) -> None:
        """``lean``: use :mod:`.resp` where it can (standalone Redis over TCP); False: redis-py always."""
        self.client = client
        self.clustered = clustered  # model-wide items go in a second script (another slot)
        self._acquire = client.register_script(ACQUIRE)
        self._release = client.register_script(RELEASE)
        self.lean = lean_client(client) if lean and not clustered else None
        self._encoded: dict[int, _Encoded] = {}
        self._loading: asyncio.Task[None] | None = None
        # redis-py's async cluster client discovers the slots lazily, and many first commands at once
        # race in that discovery (crossed or lost replies): discover once, under a lock, before use.
        self._ready = not isinstance(client, RedisCluster)
        self._init_lock: asyncio.Lock | None = None

    async def _discover(self) -> None:
        if self._init_lock is None:
            self._init_lock = asyncio.Lock()
        async with self._init_lock:
            if not self._ready:
                assert isinstance(self.client, RedisCluster)
                await self.client.initialize()
                self._ready = True

    async def _acquire_group(self, items: Sequence[Item], costs: Sequence[int], hold: str,
                             hold_ms: int) -> Outcome:
        keys = [i.key for i in items]
        raw = await self._acquire(keys=keys, args=[hold, hold_ms, *_args(items, costs)])
        levels = tuple(float(x) for x in raw[2:])
        return Outcome(bool(raw[0]), levels, int(raw[1]) - 1)

    def _encode(self, items: Sequence[Item]) -> _Encoded:
        enc = self._encoded.get(id(items))
        if enc is None or enc.items is not items:
            if len(self._encoded) >= 4096:  # item lists of plans that no longer exist (config reloads)
                self._encoded.clear()
            enc = self._encoded[id(items)] = _Encoded(items)
        return enc

    async def _load_scripts(self) -> None:
        """SCRIPT LOAD both scripts (after NOSCRIPT: a Redis restart or SCRIPT FLUSH); once at a time."""
        if self._loading is None or self._loading.done():
            self._loading = asyncio.get_running_loop().create_task(self._load_now())
        await asyncio.shield(self._loading)

    async def _load_now(self) -> None:
        assert self.lean is not None
        for name, body in (("a", ACQUIRE), ("r", RELEASE)):
            reply = await self.lean.call(command("SCRIPT", "LOAD", body))
            if isinstance(reply, RespError) or reply != _SHA[name]:
                raise LimiterFailure(f"SCRIPT LOAD failed: {reply!r}")

    async def _lean_call(self, payload: bytes) -> Reply:
        """Send, and on NOSCRIPT load the scripts and send again; a connection that died with a Redis
        restart is replaced once (the command never reached that Redis)."""
        assert self.lean is not None
        reconnected = loaded = False
        while True:
            try:
                reply = await self.lean.call(payload)
            except ConnectionError as exc:
                if reconnected:
                    raise LimiterFailure(f"{type(exc).__name__}: {exc}") from exc
                reconnected = True
                continue
            if _noscript(reply) and not loaded:
                loaded = True
                await self._load_scripts()
                continue
            if isinstance(reply, RespError):
                raise LimiterFailure(f"Redis: {reply}")
            return reply

    @property
    def bounded(self) -> bool:
        """``acquire`` raises TimeoutError on its own after ``lean.timeout_s`` (no asyncio.timeout needed)."""
        return self.lean is not None

    async def _lean_acquire(self, payload: bytes) -> Reply:
        lean = self.lean
        assert lean is not None
        budget = lean.timeout_s
        if lean.connected() is not None:  # the usual case: one call, bounded by the client's deadline
            loop = asyncio.get_running_loop()
            started = loop.time()
            try:
                reply = await lean.call(payload)
                if not isinstance(reply, RespError):
                    return reply
            except ConnectionError:
                pass
            budget -= loop.time() - started
        async with asyncio.timeout(max(0.0, budget)):  # connect, reload the scripts, send again: one budget
            return await self._lean_call(payload)

    async def acquire(self, items: Sequence[Item], costs: Sequence[int], hold: str, hold_ms: int) -> Outcome:
        if self.lean is not None:
            raw = await self._lean_acquire(self._encode(items).acquire(costs, hold, hold_ms))
            return Outcome(raw[0] == 1, tuple(map(float, raw[2:])), raw[1] - 1)
        try:
            if not self._ready:
                await self._discover()
            if not self.clustered:
                return await self._acquire_group(items, costs, hold, hold_ms)
            own = [n for n, i in enumerate(items) if not i.shared]
            shared = [n for n, i in enumerate(items) if i.shared]
            if not own or not shared:
                return await self._acquire_group(items, costs, hold, hold_ms)
            groups = (own, shared)
            a, b = await asyncio.gather(*(
                self._acquire_group([items[n] for n in g], [costs[n] for n in g], hold, hold_ms) for g in groups))
            if a.ok and b.ok:
                levels = [0.0] * len(items)
                for g, o in ((own, a), (shared, b)):
                    for n, level in zip(g, o.levels, strict=True):
                        levels[n] = level
                return Outcome(True, tuple(levels))
            # Give back the group that succeeded; report the first refusal in plan order.
            for g, o in ((own, a), (shared, b)):
                if o.ok:
                    await self._release_group([items[n] for n in g], [costs[n] for n in g], hold)
            g, o = (own, a) if not a.ok else (shared, b)
            failed = g[o.failed]
            levels_by_index = dict(zip(g, o.levels, strict=False))
            return Outcome(False, tuple(levels_by_index.get(n, float(items[n].capacity))
                                        for n in range(failed + 1)), failed)
        except RedisError as exc:
            raise LimiterFailure(f"{type(exc).__name__}: {exc}") from exc

    async def _release_group(self, items: Sequence[Item], refunds: Sequence[int], hold: str) -> None:
        await self._release(keys=[i.key for i in items], args=[hold, *_args(items, refunds)])

    async def release(self, items: Sequence[Item], refunds: Sequence[int], hold: str) -> None:
        if self.lean is not None:
            await self._lean_call(self._encode(items).release(refunds, hold))
            return
        try:
            if not self.clustered:
                await self._release_group(items, refunds, hold)
                return
            own = [n for n, i in enumerate(items) if not i.shared]
            shared = [n for n, i in enumerate(items) if i.shared]
            await asyncio.gather(*(
                self._release_group([items[n] for n in g], [refunds[n] for n in g], hold)
                for g in (own, shared) if g))
        except RedisError as exc:
            raise LimiterFailure(f"{type(exc).__name__}: {exc}") from exc

    def release_nowait(self, items: Sequence[Item], refunds: Sequence[int], hold: str,
                       done: Callable[[BaseException | None], None]) -> bool:
        """Send the give-back without a task; ``done(error or None)`` when Redis has answered.

        False (nothing sent) when the lean connection is not up: then the caller awaits ``release``."""
        if self.lean is None:
            return False
        payload = self._encode(items).release(refunds, hold)

        def answered(reply: Reply | BaseException) -> None:
            if _noscript(reply) or isinstance(reply, ConnectionError):  # rare: the awaited path retries
                task = asyncio.get_running_loop().create_task(self._lean_call(payload))
                task.add_done_callback(lambda t: done(None if t.cancelled() else t.exception()))
            elif isinstance(reply, BaseException):
                done(reply if not isinstance(reply, RespError) else LimiterFailure(f"Redis: {reply}"))
            else:
                done(None)

        return self.lean.call_nowait(payload, answered)

    async def aclose(self) -> None:
        if self.lean is not None:
            await self.lean.aclose()
        await self.client.aclose()
