"""Admin edits as an overlay on the config file, and how the two merge into the config the gateway serves.

The config file is the base. The overlay holds, per model ID and per key name, the entry an admin wrote
(a ``models[]`` / ``keys[]`` entry as a plain dict, secrets included: the stores keep them like the config
file does) or a tombstone (``spec`` None: deleted, even when the file still has it). Every entry carries
its own ``version`` (optimistic concurrency); the overlay as a whole carries ``version``, bumped by every
edit, which instances compare to know whether they serve the latest state.

Pure code: no I/O. ``merge`` validates the result with the config schema's own rules (the same messages
as ``gateway check-config``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from pydantic import ValidationError

from gateway.config.loader import field_path
from gateway.config.schema import GatewayConfig, KeySpec, ModelSpec, UpstreamSpec
from gateway.errors import InvalidRequest


@dataclass(frozen=True, slots=True)
class Entry:
    spec: Mapping[str, Any] | None  # None: a tombstone
    version: int
    prefix: str | None = None  # keys made by the admin API: the secret's first characters


def _frozen(d: dict[str, Entry]) -> Mapping[str, Entry]:
    return MappingProxyType(dict(d))


@dataclass(frozen=True, slots=True)
class State:
    """The overlay: what admins changed, and the version of the whole (0: never edited)."""

    version: int = 0
    models: Mapping[str, Entry] = field(default_factory=lambda: MappingProxyType({}))
    keys: Mapping[str, Entry] = field(default_factory=lambda: MappingProxyType({}))

    def with_model(self, model_id: str, entry: Entry) -> State:
        return State(self.version + 1, _frozen({**self.models, model_id: entry}), self.keys)

    def with_key(self, name: str, entry: Entry) -> State:
        return State(self.version + 1, self.models, _frozen({**self.keys, name: entry}))

    def to_json(self) -> dict[str, Any]:
        def dump(entries: Mapping[str, Entry]) -> dict[str, Any]:
            out: dict[str, Any] = {}
            for k, e in entries.items():
                item: dict[str, Any] = {"spec": None if e.spec is None else dict(e.spec), "version": e.version}
                if e.prefix is not None:
                    item["prefix"] = e.prefix
                out[k] = item
            return out

        return {"version": self.version, "models": dump(self.models), "keys": dump(self.keys)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> State:
        def load(entries: Mapping[str, Any]) -> Mapping[str, Entry]:
            return _frozen({str(k): Entry(v.get("spec"), int(v.get("version", 1)), v.get("prefix"))
                            for k, v in entries.items()})

        return cls(int(data.get("version", 0)), load(data.get("models") or {}), load(data.get("keys") or {}))


@dataclass(frozen=True, slots=True)
class Meta:
    source: str  # "config" or "admin"
    version: int
    prefix: str | None = None


@dataclass(frozen=True, slots=True)
class Merged:
    """The config the gateway serves (file + overlay), and where each model and key came from."""

    config: GatewayConfig
    models: Mapping[str, Meta]
    keys: Mapping[str, Meta]
    version: int


def _key_prefix(spec: KeySpec) -> str | None:
    return spec.key.get_secret_value()[:10] if spec.key is not None else None


def invalid(exc: ValidationError, under: str = "") -> InvalidRequest:
    """A schema error as a 400 whose ``param`` is the field path (``upstreams.0.url``) and whose
    message is the config checker's (``upstreams[0].url: ...``)."""
    err = exc.errors(include_url=False)[0]
    loc = tuple(err["loc"])
    msg = "unknown field" if err["type"] == "extra_forbidden" else str(err["msg"]).removeprefix("Value error, ")
    prefix = tuple(p for p in under.split(".") if p)
    full = (*prefix, *loc)
    param = ".".join(str(p) for p in full) or None
    return InvalidRequest(f"{field_path(full)}: {msg}", param=param, code="invalid_value")


def parse_model(data: Mapping[str, Any]) -> ModelSpec:
    try:
        return ModelSpec.model_validate(data)
    except ValidationError as exc:
        raise invalid(exc) from None


def parse_upstream(data: Mapping[str, Any], under: str = "") -> UpstreamSpec:
    try:
        return UpstreamSpec.model_validate(data)
    except ValidationError as exc:
        raise invalid(exc, under) from None


def parse_key(data: Mapping[str, Any]) -> KeySpec:
    try:
        return KeySpec.model_validate(data)
    except ValidationError as exc:
        raise invalid(exc) from None


def model_to_dict(spec: ModelSpec) -> dict[str, Any]:
    """A model as a ``models[]`` entry (secrets in clear: for the stores only, never for a response)."""
    out = spec.model_dump(mode="json", exclude_defaults=True)
    out["id"] = spec.id
    for i, u in enumerate(spec.upstreams):
        out["upstreams"][i]["name"] = u.name
        if u.api_key is not None:
            out["upstreams"][i]["api_key"] = u.api_key.get_secret_value()
    return out


def key_to_dict(spec: KeySpec) -> dict[str, Any]:
    out = spec.model_dump(mode="json", exclude_defaults=True, exclude={"key"})
    out["name"] = spec.name
    if spec.key is not None:
        out["key"] = spec.key.get_secret_value()
    return out


def merge(base: GatewayConfig, state: State) -> Merged:
    """The config file with the overlay applied: replaced entries in place, added ones after the file's,
    tombstoned ones removed. Raises :class:`InvalidRequest` when the result breaks a config rule."""
    models: list[ModelSpec] = []
    model_meta: dict[str, Meta] = {}
    seen: set[str] = set()
    for m in base.models:
        seen.add(m.id)
        over = state.models.get(m.id)
        if over is None:
            models.append(m)
            model_meta[m.id] = Meta("config", 1)
        elif over.spec is not None:
            models.append(parse_model(over.spec))
            model_meta[m.id] = Meta("admin", over.version)
    for mid, over in state.models.items():
        if mid not in seen and over.spec is not None:
            models.append(parse_model(over.spec))
            model_meta[mid] = Meta("admin", over.version)
    keys: list[KeySpec] = []
    key_meta: dict[str, Meta] = {}
    seen = set()
    for k in base.keys:
        seen.add(k.name)
        kover = state.keys.get(k.name)
        if kover is None:
            keys.append(k)
            key_meta[k.name] = Meta("config", 1, _key_prefix(k))
        elif kover.spec is not None:
            keys.append(parse_key(kover.spec))
            key_meta[k.name] = Meta("admin", kover.version, kover.prefix)
    for name, kover in state.keys.items():
        if name not in seen and kover.spec is not None:
            keys.append(parse_key(kover.spec))
            key_meta[name] = Meta("admin", kover.version, kover.prefix)
    fields: dict[str, Any] = {name: getattr(base, name) for name in GatewayConfig.model_fields}
    fields.update(models=models, keys=keys)
    try:
        config = GatewayConfig.model_validate(fields)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        raise InvalidRequest(str(err["msg"]).removeprefix("Value error, "), code="invalid_value") from None
    return Merged(config, MappingProxyType(model_meta), MappingProxyType(key_meta), state.version)
