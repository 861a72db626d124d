"""Admin edits: validate, check versions, commit to the store, apply, audit, log.

Every edit runs as: read the stored overlay -> change one entry (checking ``If-Match`` against the
entry's version) -> merge with the config file and validate the result -> compare-and-set in the store
(retried from the top when another edit got in first) -> apply (a new snapshot through the composition
root's ``apply``) -> one structured log line; the store appends the audit entry in the same write.
The API layer only parses HTTP and renders; this module never sees a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from gateway.admin.overlay import (
    Entry,
    Merged,
    Meta,
    State,
    key_to_dict,
    merge,
    model_to_dict,
    parse_key,
    parse_model,
    parse_upstream,
)
from gateway.admin.rules import check_version, cross_check, keep_secrets, key_check, strip_response_fields
from gateway.admin.store import StateStore, StoreError
from gateway.admin.views import KEY_LIMIT_FIELDS, key_view, model_view
from gateway.auth.keys import hash_key, new_key
from gateway.config.live import restart_sections
from gateway.config.schema import GatewayConfig, KeySpec, ModelSpec
from gateway.errors import Conflict, GatewayError, InvalidRequest, ModelNotFound, NotFound, UpstreamError
from gateway.routing.probe import probe_upstream

log = logging.getLogger("gateway.admin")

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_KEY_PATCHABLE = frozenset({"models", "per_model", *KEY_LIMIT_FIELDS})
MAX_ATTEMPTS = 50

Apply = Callable[[GatewayConfig, int], object]


@dataclass(frozen=True, slots=True)
class Change:
    """What one edit did: the new state, the audit entry, and what to answer."""

    state: State
    action: str
    target: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    result: dict[str, Any]


Mutation = Callable[[State, Merged], Change]


class AdminService:
    def __init__(self, base: GatewayConfig, store: StateStore, apply: Apply, *,
                 loader: Callable[[], GatewayConfig] | None = None, probe_timeout_s: float = 5.0) -> None:
        self.base = base
        self.running = base  # the file as the process started with it: what the non-live sections run on
        self.store = store
        self._apply_fn = apply
        self.loader = loader
        self.probe_timeout_s = probe_timeout_s
        self.instance_id = uuid.uuid4().hex[:12]
        self.merged = merge(base, State())
        self.last_sync: float | None = None
        self._lock = asyncio.Lock()
        self._watch: asyncio.Task[None] | None = None

    # --- life cycle -----------------------------------------------------------------------------

    @property
    def version(self) -> int:
        return self.merged.version

    async def start(self) -> None:
        """Load the stored overlay (a failure here stops start-up: revoked keys must not come back)."""
        state = await self.store.load()
        await self._install(state)
        self._watch = asyncio.create_task(self.store.watch(self._on_change, lambda: self.version),
                                          name="gateway-admin-watch")

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        await self.store.aclose()

    async def _install(self, state: State) -> None:
        merged = merge(self.base, state)
        self.merged = merged
        self._apply_fn(merged.config, state.version)
        self.last_sync = time.time()

    async def _on_change(self, state: State) -> None:
        async with self._lock:
            try:
                await self._install(state)
            except GatewayError as err:
                log.error("admin overlay version %d does not fit this instance's config file: %s",
                          state.version, err.message, extra={"config_version": state.version})
                return
        log.info("applied admin overlay version %d", state.version, extra={"config_version": state.version})

    async def sync(self) -> None:
        """Re-read the store and serve what it holds (after an edit, and on a slow poll)."""
        async with self._lock:
            state = await self.store.load()
            if state.version != self.version:
                await self._install(state)
            else:
                self.last_sync = time.time()

    async def reload(self) -> dict[str, Any]:
        """SIGHUP / POST /admin/reload: read the config file again and apply the overlay on it."""
        if self.loader is None:
            raise InvalidRequest("This gateway was not started from a config file; nothing to reload.")
        try:
            base = self.loader()
        except Exception as exc:  # a ConfigError names every bad field
            raise InvalidRequest(f"The config file cannot be used: {exc}", code="invalid_config") from None
        async with self._lock:
            state = await self.store.load()
            merged = merge(base, state)
            self.base = base
            self.merged = merged
            self._apply_fn(merged.config, state.version)
            self.last_sync = time.time()
        log.info("config file reloaded; admin overlay version %d applied", state.version,
                 extra={"config_version": state.version, "action": "reload"})
        stale = restart_sections(self.running, base)
        if stale:
            log.warning("config file reloaded, but %s changed, which only a restart applies (a reload applies "
                        "models, keys and admin.keys); the running values stay until then", ", ".join(stale),
                        extra={"action": "reload"})
        return {"reloaded": True, "version": state.version, "restart_needed": stale}

    # --- reads ----------------------------------------------------------------------------------

    def models(self) -> list[dict[str, Any]]:
        m = self.merged
        return [model_view(spec, m.models[spec.id]) for spec in m.config.models]

    def _model(self, merged: Merged, model_id: str) -> tuple[ModelSpec, Meta]:
        for spec in merged.config.models:
            if spec.id == model_id:
                return spec, merged.models[model_id]
        raise ModelNotFound(f"There is no model {model_id!r}.", param="id")

    def model(self, model_id: str) -> dict[str, Any]:
        return model_view(*self._model(self.merged, model_id))

    def keys(self) -> list[dict[str, Any]]:
        m = self.merged
        return [key_view(spec, m.keys[spec.name]) for spec in m.config.keys]

    def _key(self, merged: Merged, name: str) -> tuple[KeySpec, Meta]:
        for spec in merged.config.keys:
            if spec.name == name:
                return spec, merged.keys[name]
        raise NotFound(f"There is no key named {name!r}.", param="name")

    async def audit(self, limit: int) -> list[dict[str, Any]]:
        try:
            return await self.store.audit(limit)
        except StoreError as exc:
            raise GatewayError(f"The admin store is unavailable. ({exc})", status=503,
                               code="admin_store_unavailable") from None

    # --- the edit loop --------------------------------------------------------------------------

    async def _edit(self, admin: str, mutate: Mutation) -> dict[str, Any]:
        try:
            return await self._edit_once(admin, mutate)
        except StoreError as exc:
            log.error("admin edit by %s failed: %s", admin, exc, extra={"admin": admin})
            raise GatewayError(f"The admin store is unavailable; nothing was changed. ({exc})", status=503,
                               code="admin_store_unavailable") from None

    async def _edit_once(self, admin: str, mutate: Mutation) -> dict[str, Any]:
        for _ in range(MAX_ATTEMPTS):
            state = await self.store.load()
            merged = merge(self.base, state)
            change = mutate(state, merged)
            merge(self.base, change.state)  # the whole config must still be valid
            entry = {"ts": time.time(), "admin": admin, "action": change.action, "target": change.target,
                     "before": change.before, "after": change.after, "version": change.state.version}
            if await self.store.commit(state.version, change.state, [entry]):
                log.info("admin %s %s %s", admin, change.action, change.target,
                         extra={"admin": admin, "action": change.action, "target": change.target,
                                "config_version": change.state.version})
                await self.sync()
                return change.result
        raise Conflict("Too many concurrent admin edits; try again.", code="busy")

    # --- models ---------------------------------------------------------------------------------

    def _model_body(self, body: Mapping[str, Any], model_id: str | None, current: ModelSpec | None) -> ModelSpec:
        data = strip_response_fields(body)
        if model_id is not None:
            if "id" in data and data["id"] != model_id:
                raise InvalidRequest(f"id: the body's id {data['id']!r} differs from the URL's {model_id!r}",
                                     param="id", code="invalid_value")
            data["id"] = model_id
        mid = data.get("id")
        return parse_model(keep_secrets(str(mid), data, current) if isinstance(mid, str) else data)

    async def _verify(self, spec: ModelSpec, current: ModelSpec | None) -> None:
        old = {u.name: u for u in current.upstreams} if current is not None else {}
        async with httpx.AsyncClient(trust_env=False, timeout=self.probe_timeout_s) as client:
            for i, u in enumerate(spec.upstreams):
                before = old.get(u.name)
                if before is not None and (before.url, before.model, before.api_key_value()) == \
                        (u.url, u.model, u.api_key_value()):
                    continue
                result = await probe_upstream(client, u, self.probe_timeout_s)
                if not result.ok:
                    raise UpstreamError(f"upstreams[{i}] ({u.name}) failed verification: {result.detail}",
                                        param=f"upstreams.{i}", code="upstream_verify_failed")

    def _put_model(self, spec: ModelSpec, if_match: int | None, action: str,
                   must_be_new: bool = False) -> Mutation:
        def mutate(state: State, merged: Merged) -> Change:
            before = None
            version = 1
            exists = spec.id in merged.models
            if exists:
                cur, meta = self._model(merged, spec.id)
                if must_be_new:
                    raise Conflict(f"Model {spec.id!r} already exists; PUT or PATCH /admin/models/{spec.id} "
                                   f"changes it.", param="id", code="already_exists")
                check_version(if_match, meta, f"Model {spec.id!r}")
                before = model_view(cur, meta)
                version = meta.version + 1
            else:
                if if_match is not None:
                    raise ModelNotFound(f"There is no model {spec.id!r}.", param="id")
                tomb = state.models.get(spec.id)
                version = tomb.version + 1 if tomb is not None else 1
            cross_check(merged, spec)
            new = state.with_model(spec.id, Entry(model_to_dict(spec), version))
            after = model_view(spec, Meta("admin", version))
            return Change(new, action, spec.id, before, after, after)

        return mutate

    async def create_model(self, admin: str, body: Mapping[str, Any], verify: bool) -> dict[str, Any]:
        spec = self._model_body(body, None, None)
        if verify:
            await self._verify(spec, None)
        return await self._edit(admin, self._put_model(spec, None, "model.create", must_be_new=True))

    async def replace_model(self, admin: str, model_id: str, body: Mapping[str, Any], if_match: int | None,
                            verify: bool) -> dict[str, Any]:
        current = self._current_model(model_id)
        spec = self._model_body(body, model_id, current)
        if verify:
            await self._verify(spec, current)
        return await self._edit(admin, self._put_model(spec, if_match, "model.replace"))

    def _current_model(self, model_id: str) -> ModelSpec | None:
        return next((m for m in self.merged.config.models if m.id == model_id), None)

    async def patch_model(self, admin: str, model_id: str, body: Mapping[str, Any], if_match: int | None,
                          verify: bool) -> dict[str, Any]:
        current = self._current_model(model_id)
        if current is None:
            raise ModelNotFound(f"There is no model {model_id!r}.", param="id")
        data = {**model_to_dict(current), **strip_response_fields(body)}
        spec = self._model_body(data, model_id, current)
        if verify:
            await self._verify(spec, current)
        return await self._edit(admin, self._put_model(spec, if_match, "model.update"))

    async def delete_model(self, admin: str, model_id: str, if_match: int | None) -> dict[str, Any]:
        def mutate(state: State, merged: Merged) -> Change:
            cur, meta = self._model(merged, model_id)
            check_version(if_match, meta, f"Model {model_id!r}")
            users = [k.name for k in merged.config.keys if model_id in k.models or model_id in k.per_model]
            if users:
                raise Conflict(f"Keys {', '.join(repr(u) for u in users)} name model {model_id!r}; take it out "
                               f"of their models (PATCH /admin/keys/<name>) first.", code="in_use")
            new = state.with_model(model_id, Entry(None, meta.version + 1))
            return Change(new, "model.delete", model_id, model_view(cur, meta), None,
                          {"id": model_id, "deleted": True})

        return await self._edit(admin, mutate)

    # --- upstreams one by one -------------------------------------------------------------------

    async def _edit_upstreams(self, admin: str, model_id: str, if_match: int | None, action: str, target: str,
                              change: Callable[[ModelSpec, list[dict[str, Any]]], list[dict[str, Any]]],
                              verify: bool) -> dict[str, Any]:
        current = self._current_model(model_id)
        if current is None:
            raise ModelNotFound(f"There is no model {model_id!r}.", param="id")
        data = model_to_dict(current)
        data["upstreams"] = change(current, list(data["upstreams"]))
        spec = parse_model(data)
        if verify:
            await self._verify(spec, current)

        base_mutate = self._put_model(spec, if_match, action)

        def mutate(state: State, merged: Merged) -> Change:
            latest, _ = self._model(merged, model_id)
            if model_to_dict(latest) != model_to_dict(current):
                # Changed since we read it: redo the change on the latest (upstream edits compose).
                d = model_to_dict(latest)
                d["upstreams"] = change(latest, list(d["upstreams"]))
                res = self._put_model(parse_model(d), if_match, action)(state, merged)
            else:
                res = base_mutate(state, merged)
            return Change(res.state, res.action, target, res.before, res.after, res.result)

        return await self._edit(admin, mutate)

    async def add_upstream(self, admin: str, model_id: str, body: Mapping[str, Any], if_match: int | None,
                           verify: bool) -> dict[str, Any]:
        up = dict(strip_response_fields({"upstreams": [dict(body)]})["upstreams"][0]) \
            if isinstance(body, Mapping) else body
        parse_upstream(up)  # its own field paths (url, model, ...)

        def change(cur: ModelSpec, ups: list[dict[str, Any]]) -> list[dict[str, Any]]:
            names = {u.name for u in cur.upstreams}
            new = dict(up)
            if not new.get("name"):
                n = len(ups)
                while f"{model_id}-{n}" in names:
                    n += 1
                new["name"] = f"{model_id}-{n}"
            if new["name"] in names:
                raise Conflict(f"Model {model_id!r} already has an upstream named {new['name']!r}.",
                               param="name", code="already_exists")
            return [*ups, new]

        return await self._edit_upstreams(admin, model_id, if_match, "upstream.add", model_id, change, verify)

    async def patch_upstream(self, admin: str, model_id: str, name: str, body: Mapping[str, Any],
                             if_match: int | None, verify: bool) -> dict[str, Any]:
        fields = {k: v for k, v in body.items() if k not in ("api_key_set", "launch_set")}
        if "name" in fields and fields["name"] != name:
            raise InvalidRequest("name: an upstream's name cannot be changed (add a new one and delete this one)",
                                 param="name", code="invalid_value")

        def change(cur: ModelSpec, ups: list[dict[str, Any]]) -> list[dict[str, Any]]:
            for i, u in enumerate(ups):
                if u["name"] == name:
                    merged_up = {**u, **fields}
                    parse_upstream(merged_up)
                    return [*ups[:i], merged_up, *ups[i + 1:]]
            raise NotFound(f"Model {model_id!r} has no upstream named {name!r}.", param="name")

        return await self._edit_upstreams(admin, model_id, if_match, "upstream.update", f"{model_id}/{name}",
                                          change, verify)

    async def delete_upstream(self, admin: str, model_id: str, name: str, if_match: int | None) -> dict[str, Any]:
        def change(cur: ModelSpec, ups: list[dict[str, Any]]) -> list[dict[str, Any]]:
            rest = [u for u in ups if u["name"] != name]
            if len(rest) == len(ups):
                raise NotFound(f"Model {model_id!r} has no upstream named {name!r}.", param="name")
            if not rest:
                raise InvalidRequest(f"upstreams: model {model_id!r} needs at least one upstream; delete the model "
                                     f"instead", param="upstreams", code="invalid_value")
            return rest

        await self._edit_upstreams(admin, model_id, if_match, "upstream.delete", f"{model_id}/{name}", change,
                                   False)
        return {"name": name, "deleted": True}

    # --- client keys ----------------------------------------------------------------------------

    async def create_key(self, admin: str, body: Mapping[str, Any]) -> dict[str, Any]:
        data = {k: v for k, v in body.items() if k not in ("source", "version", "prefix")}
        for f in ("key", "key_sha256"):
            if f in data:
                raise InvalidRequest(f"{f}: the gateway makes the key and answers it once; leave {f} out",
                                     param=f, code="invalid_value")
        name = data.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise InvalidRequest("name: must be 1-128 characters of letters, digits, '.', '_', ':' or '-'",
                                 param="name", code="invalid_value")
        secret = new_key()
        spec = parse_key({**data, "key_sha256": hash_key(secret)})
        stored = key_to_dict(spec)

        def mutate(state: State, merged: Merged) -> Change:
            if name in merged.keys:
                raise Conflict(f"A key named {name!r} already exists.", param="name", code="already_exists")
            key_check(merged, spec)
            tomb = state.keys.get(name)
            version = tomb.version + 1 if tomb is not None else 1
            entry = Entry(stored, version, secret[:10])
            view = key_view(spec, Meta("admin", version, entry.prefix))
            return Change(state.with_key(name, entry), "key.create", name, None, view, {**view, "key": secret})

        return await self._edit(admin, mutate)

    async def patch_key(self, admin: str, name: str, body: Mapping[str, Any], if_match: int | None) -> dict[str, Any]:
        fields = {k: v for k, v in body.items() if k not in ("source", "version", "prefix", "name")
                  or (k == "name" and v != name)}
        bad = sorted(set(fields) - _KEY_PATCHABLE)
        if bad:
            raise InvalidRequest(f"{bad[0]}: cannot be changed here (only models, per_model, "
                                 f"{', '.join(KEY_LIMIT_FIELDS)}); to change a key's secret, create a new key and "
                                 f"revoke this one", param=bad[0], code="invalid_value")

        def mutate(state: State, merged: Merged) -> Change:
            cur, meta = self._key(merged, name)
            check_version(if_match, meta, f"Key {name!r}")
            data = key_to_dict(cur)
            if "key" in data:  # a config key given in clear: the overlay keeps only its hash
                data["key_sha256"] = hash_key(data.pop("key"))
            spec = parse_key({**data, **fields})
            key_check(merged, spec)
            entry = Entry(key_to_dict(spec), meta.version + 1, meta.prefix)
            view = key_view(spec, Meta("admin", entry.version, entry.prefix))
            return Change(state.with_key(name, entry), "key.update", name, key_view(cur, meta), view, view)

        return await self._edit(admin, mutate)

    async def delete_key(self, admin: str, name: str, if_match: int | None) -> dict[str, Any]:
        def mutate(state: State, merged: Merged) -> Change:
            cur, meta = self._key(merged, name)
            check_version(if_match, meta, f"Key {name!r}")
            new = state.with_key(name, Entry(None, meta.version + 1, meta.prefix))
            return Change(new, "key.delete", name, key_view(cur, meta), None, {"name": name, "deleted": True})

        return await self._edit(admin, mutate)

