"""The gateway's core data types, shared by every layer (they import nothing but the config schema).

A public model (:class:`ModelEntry`) and the backends that serve it (:class:`Upstream`), as the
mapping snapshot holds them and the router and forwarder use them.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config.schema import UpstreamSpec


@dataclass(frozen=True, slots=True)
class Upstream:
    """One backend as the forwarder needs it (the key stays a secret until the header is built)."""

    name: str
    model_id: str  # the public ID it serves
    base_url: str
    served_name: str
    spec: UpstreamSpec
    weight: int

    @classmethod
    def from_spec(cls, model_id: str, spec: UpstreamSpec) -> Upstream:
        assert spec.name is not None
        return cls(spec.name, model_id, spec.url, spec.model, spec, spec.weight)


@dataclass(frozen=True, slots=True)
class ModelEntry:
    id: str
    upstreams: tuple[Upstream, ...]
    owned_by: str
    created: int
