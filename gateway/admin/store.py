"""Where the admin overlay lives: one protocol, two stores.

- :class:`FileStore` (default): one JSON file (overlay + audit), written atomically (temp file, fsync,
  rename, fsync of the directory) under an ``flock`` so several processes on one host (``workers > 1``)
  can share it; each process notices another's write by polling the file's identity twice a second.
- :class:`RedisStore` (``GATEWAY_REDIS_URL``): the overlay as one JSON value with a version counter beside
  it, written by a compare-and-set script that also appends the audit entries and publishes the new
  version; instances apply a published edit at once and catch up by version on a slow poll (a missed
  message: Redis restarted, a network blip).

``commit(expected, state, audit)`` writes only if the stored version is still ``expected`` (else False:
the caller re-reads and re-applies its edit, so two edits never overwrite each other unseen).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from redis.exceptions import RedisError

from gateway.admin.overlay import State
from gateway.redis_client import AsyncRedis

log = logging.getLogger("gateway.admin")

OnChange = Callable[[State], Awaitable[None]]


class AdminSetupError(Exception):
    """The admin API cannot start as configured (a start-up error with a clear message)."""


class StoreError(AdminSetupError):
    """The store cannot be used (a state file that cannot be written, unreadable JSON)."""


class StateStore(Protocol):
    kind: str  # "file" or "redis"

    async def load(self) -> State: ...

    async def commit(self, expected: int, state: State, audit: list[dict[str, Any]]) -> bool: ...

    async def audit(self, limit: int) -> list[dict[str, Any]]: ...

    async def watch(self, on_change: OnChange, current: Callable[[], int]) -> None:
        """Run until cancelled: call ``on_change`` with the stored state whenever its version differs
        from ``current()`` (the version this instance serves)."""
        ...

    async def aclose(self) -> None: ...


# --- file store ---------------------------------------------------------------------------------

class FileStore:
    kind = "file"

    def __init__(self, path: Path, audit_size: int = 1000, poll_s: float = 0.5) -> None:
        self.path = path
        self.audit_size = audit_size
        self.poll_s = poll_s
        self._lock_path = path.with_name(path.name + ".lock")
        self._lock = asyncio.Lock()
        self._cache: tuple[tuple[int, int, int], dict[str, Any]] | None = None

    def check_writable(self) -> None:
        """Start-up check: the directory exists and this process can create files in it."""
        d = self.path.parent
        if not d.is_dir():
            raise StoreError(f"admin state file {self.path}: directory {d} does not exist "
                             f"(set admin.state_file or GATEWAY_STATE_FILE to a writable place)")
        try:
            fd, tmp = tempfile.mkstemp(prefix=".gateway-state-check-", dir=d)
            os.close(fd)
            os.unlink(tmp)
            with open(self._lock_path, "a"):
                pass
            if self.path.exists() and not os.access(self.path, os.R_OK | os.W_OK):
                raise PermissionError(f"cannot read and write {self.path}")
        except OSError as exc:
            raise StoreError(f"admin state file {self.path} is not writable: {exc} "
                             f"(set admin.state_file or GATEWAY_STATE_FILE to a writable place)") from None
        self._read()  # a corrupt file is a start-up error too

    def _identity(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _read(self) -> dict[str, Any]:
        ident = self._identity()
        if ident is None:
            return {"version": 0, "models": {}, "keys": {}, "audit": []}
        if self._cache is not None and self._cache[0] == ident:
            return self._cache[1]
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise StoreError(f"admin state file {self.path} cannot be read: {exc}") from None
        if not isinstance(data, dict):
            raise StoreError(f"admin state file {self.path}: not a JSON object")
        self._cache = (ident, data)
        return data

    async def load(self) -> State:
        return State.from_json(self._read())

    def _write(self, data: dict[str, Any]) -> None:
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                os.fchmod(f.fileno(), 0o600)  # it holds upstream api keys
                json.dump(data, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        dfd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def _commit(self, expected: int, state: State, audit: list[dict[str, Any]]) -> bool:
        with open(self._lock_path, "a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # other processes sharing the file wait here
            try:
                self._cache = None
                current = self._read()
                if int(current.get("version", 0)) != expected:
                    return False
                entries = list(reversed(audit)) + list(current.get("audit") or [])
                self._write({**state.to_json(), "audit": entries[: self.audit_size]})
                return True
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    async def commit(self, expected: int, state: State, audit: list[dict[str, Any]]) -> bool:
        async with self._lock:
            return await asyncio.to_thread(self._commit, expected, state, audit)

    async def audit(self, limit: int) -> list[dict[str, Any]]:
        return list(self._read().get("audit") or [])[:limit]

    async def watch(self, on_change: OnChange, current: Callable[[], int]) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                state = await self.load()
                if state.version != current():
                    await on_change(state)
            except Exception:
                log.exception("admin state file %s: reading it failed", self.path)

    async def aclose(self) -> None:
        return None


# --- Redis store --------------------------------------------------------------------------------

# One hash tag: every key in one cluster slot, so the script may touch them all.
_STATE = "{gateway:admin}:state"
_VERSION = "{gateway:admin}:version"
_AUDIT = "{gateway:admin}:audit"
CHANNEL = "gateway:admin:changed"

_CAS = """
local v = tonumber(redis.call('GET', KEYS[2]) or '0')
if v ~= tonumber(ARGV[1]) then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], ARGV[3])
for i = 5, #ARGV do redis.call('LPUSH', KEYS[3], ARGV[i]) end
redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[4]) - 1)
redis.call('PUBLISH', 'gateway:admin:changed', ARGV[3])
return 1
"""


class RedisStore:
    kind = "redis"

    def __init__(self, client: AsyncRedis, *, cluster: bool = False, audit_size: int = 1000,
                 poll_s: float = 5.0) -> None:
        self.client = client
        self.cluster = cluster
        self.audit_size = audit_size
        self.poll_s = poll_s
        self._cas = client.register_script(_CAS)
        self.wake = asyncio.Event()

    async def load(self) -> State:
        try:
            raw = await self.client.get(_STATE)
        except RedisError as exc:
            raise StoreError(f"the admin store (Redis) did not answer: {exc}") from None
        if raw is None:
            return State()
        return State.from_json(json.loads(raw))

    async def commit(self, expected: int, state: State, audit: list[dict[str, Any]]) -> bool:
        args: list[Any] = [expected, json.dumps(state.to_json(), sort_keys=True), state.version,
                           self.audit_size, *(json.dumps(a, sort_keys=True) for a in audit)]
        try:
            done = await self._cas(keys=[_STATE, _VERSION, _AUDIT], args=args)
        except RedisError as exc:
            raise StoreError(f"the admin store (Redis) did not answer: {exc}") from None
        return bool(done)

    async def audit(self, limit: int) -> list[dict[str, Any]]:
        try:
            raw = await self.client.lrange(_AUDIT, 0, limit - 1)
        except RedisError as exc:
            raise StoreError(f"the admin store (Redis) did not answer: {exc}") from None
        return [json.loads(r) for r in raw]

    async def _catch_up(self, on_change: OnChange, current: Callable[[], int]) -> None:
        raw = await self.client.get(_VERSION)
        if int(raw or 0) != current():
            await on_change(await self.load())

    async def _listen(self) -> None:
        """Subscribe and set ``wake`` on every published version; reconnect after a failure."""
        backoff = 0.1
        while True:
            try:
                pubsub = self.client.pubsub()
                try:
                    await pubsub.subscribe(CHANNEL)
                    backoff = 0.1
                    self.wake.set()  # (re)subscribed: something may have been missed meanwhile
                    while True:
                        msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                        if msg is not None:
                            self.wake.set()
                finally:
                    with contextlib.suppress(Exception):
                        await pubsub.aclose()  # type: ignore[no-untyped-call]
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("admin store: Redis subscription lost (%s); retrying", exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    async def watch(self, on_change: OnChange, current: Callable[[], int]) -> None:
        # A cluster client has no pub/sub here: it polls the version key often instead (one GET).
        listener = None if self.cluster else asyncio.create_task(self._listen(), name="gateway-admin-sub")
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.25 if self.cluster else self.poll_s):
                        await self.wake.wait()
                self.wake.clear()
                try:
                    await self._catch_up(on_change, current)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning("admin store: reading the overlay from Redis failed (%s); will retry", exc)
        finally:
            if listener is not None:
                listener.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await listener

    async def aclose(self) -> None:
        await self.client.aclose()
