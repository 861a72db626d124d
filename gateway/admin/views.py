"""The admin API's JSON shapes (docs/admin.md), built from specs: secrets never leave through here."""

from __future__ import annotations

from typing import Any

from gateway.admin.overlay import Meta
from gateway.config.schema import KeySpec, ModelSpec

KEY_LIMIT_FIELDS = ("rpm", "tpm", "max_parallel", "burst_requests", "burst_tokens")


def model_view(spec: ModelSpec, meta: Meta) -> dict[str, Any]:
    out = spec.model_dump(mode="json", exclude_none=True)
    for i, u in enumerate(spec.upstreams):
        up = out["upstreams"][i]
        up.pop("api_key", None)
        up["api_key_set"] = u.api_key is not None
        # `launch:` (for `gateway backends up`) may carry secrets in its env: write-only like api_key.
        up.pop("launch", None)
        up["launch_set"] = u.launch is not None
    for f in KEY_LIMIT_FIELDS:
        out.setdefault(f, None)
    out["source"] = meta.source
    out["version"] = meta.version
    return out


def key_view(spec: KeySpec, meta: Meta) -> dict[str, Any]:
    return {
        "name": spec.name,
        "prefix": meta.prefix,
        "models": list(spec.models),
        **{f: getattr(spec, f) for f in KEY_LIMIT_FIELDS},
        "per_model": {m: lim.model_dump(exclude_none=True) for m, lim in spec.per_model.items()},
        "source": meta.source,
        "version": meta.version,
    }
