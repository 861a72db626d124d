"""The gateway's core data types, shared by every layer (they import nothing but the config schema).

A public model (:class:`ModelEntry`) and the backends that serve it (:class:`Upstream`), as the
mapping snapshot holds them and the router and forwarder use them.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config.schema import LimitSpec, ShedSpec, UpstreamSpec


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
    limits: LimitSpec | None = None  # model-wide rate limits, shared by every key
    max_model_len: int | None = None  # the smallest launch.max_model_len of its upstreams, when known
    aliases: tuple[str, ...] = ()  # other names clients may send for this model
    routing: str = "weighted"  # weighted | least_outstanding | load_aware (gateway.routing.selector)
    affinity: str | None = None  # "header:<name>" or "user" (gateway.routing.affinity)
    shed: ShedSpec | None = None  # refuse early when every usable upstream is over these
    fallbacks: tuple[str, ...] = ()  # public model IDs to try, in order, when no upstream can take a request
