"""The rules an admin edit must pass before it is stored: pure checks of a body against the served config.

Versions (``If-Match``), response-only fields a client may send back, secrets an edit leaves out (kept),
and the rules between entries (unique upstream names, ids and aliases; keys naming known models), each
with the field path of the offending field. :mod:`gateway.admin.service` runs them inside an edit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.admin.overlay import Merged, Meta, model_to_dict
from gateway.config.schema import KeySpec, ModelSpec
from gateway.errors import Conflict, InvalidRequest

_RESPONSE_ONLY = ("source", "version", "object")


def check_version(if_match: int | None, meta: Meta, what: str) -> None:
    if if_match is not None and if_match != meta.version:
        raise Conflict(f"{what} is at version {meta.version}, not {if_match}: it was changed meanwhile; "
                       f"read it again and redo your change.", code="version_conflict")


def strip_response_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """A GET answer sent back as it is stays valid: response-only fields are dropped."""
    out = {k: v for k, v in body.items() if k not in _RESPONSE_ONLY}
    ups = out.get("upstreams")
    if isinstance(ups, list):
        out["upstreams"] = [{k: v for k, v in u.items() if k not in ("api_key_set", "launch_set")}
                            if isinstance(u, dict) else u for u in ups]
    return out


def keep_secrets(model_id: str, body: dict[str, Any], current: ModelSpec | None) -> dict[str, Any]:
    """An upstream without ``api_key`` (or ``launch``) keeps its current one (matched by name)."""
    if current is None or not isinstance(body.get("upstreams"), list):
        return body
    stored = {u.name: model_to_dict(current)["upstreams"][i] for i, u in enumerate(current.upstreams)}
    ups = []
    for i, u in enumerate(body["upstreams"]):
        if isinstance(u, dict):
            old = stored.get(u.get("name") or f"{model_id}-{i}", {})
            u = {**{f: old[f] for f in ("api_key", "launch") if f in old and f not in u}, **u}
        ups.append(u)
    return {**body, "upstreams": ups}


def cross_check(merged: Merged, spec: ModelSpec) -> None:
    """The rules between models, with the field path of the new model's offending field."""
    others = [m for m in merged.config.models if m.id != spec.id]
    names = {u.name: m.id for m in others for u in m.upstreams}
    for i, u in enumerate(spec.upstreams):
        if u.name in names:
            raise InvalidRequest(f"upstreams[{i}].name: upstream name {u.name!r} is already used by model "
                                 f"{names[u.name]!r}", param=f"upstreams.{i}.name", code="invalid_value")
    taken = {m.id: f"the id of model {m.id!r}" for m in others}
    taken.update({a: f"an alias of model {m.id!r}" for m in others for a in m.aliases})
    if spec.id in taken:
        raise InvalidRequest(f"id: {spec.id!r} is {taken[spec.id]}", param="id", code="invalid_value")
    for i, a in enumerate(spec.aliases):
        if a in taken:
            raise InvalidRequest(f"aliases[{i}]: alias {a!r} collides with {taken[a]}", param=f"aliases.{i}",
                                 code="invalid_value")


def key_check(merged: Merged, spec: KeySpec) -> None:
    known = {m.id for m in merged.config.models}
    for i, m in enumerate(spec.models):
        if m != "*" and m not in known:
            raise InvalidRequest(f"models[{i}]: unknown model {m!r}", param=f"models.{i}", code="invalid_value")
    for m in spec.per_model:
        if m not in known:
            raise InvalidRequest(f"per_model.{m}: unknown model {m!r}", param=f"per_model.{m}",
                                 code="invalid_value")
