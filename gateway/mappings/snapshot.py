"""An immutable snapshot of the model mapping: public model ID -> upstreams.

Requests resolve against one snapshot from start to end; a new mapping is a new snapshot.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from gateway.config.schema import GatewayConfig
from gateway.domain import ModelEntry, Upstream
from gateway.errors import ModelNotFound


class Caller(Protocol):
    """Who asks (an authenticated key): only which public models it may use matters here."""

    def may_use(self, model_id: str) -> bool: ...


@dataclass(frozen=True, slots=True)
class ModelTable:
    entries: dict[str, ModelEntry]
    version: int = 1

    @classmethod
    def from_config(cls, config: GatewayConfig, created: int | None = None) -> ModelTable:
        ts = int(time.time()) if created is None else created
        entries = {
            m.id: ModelEntry(m.id, tuple(Upstream.from_spec(m.id, u) for u in m.upstreams), m.owned_by, ts)
            for m in config.models
        }
        return cls(entries)

    def visible_to(self, principal: Caller) -> list[ModelEntry]:
        return [e for e in self.entries.values() if principal.may_use(e.id)]

    def resolve(self, model_id: str, principal: Caller) -> ModelEntry:
        """The entry for ``model_id`` if this key may use it; otherwise one and the same 404."""
        entry = self.entries.get(model_id)
        if entry is None or not principal.may_use(model_id):
            visible = ", ".join(e.id for e in self.visible_to(principal)) or "none"
            raise ModelNotFound(
                f"The model `{model_id}` does not exist or you do not have access to it. "
                f"Models available to this key: {visible}.",
                param="model",
            )
        return entry

    def upstreams(self) -> list[Upstream]:
        return [u for e in self.entries.values() for u in e.upstreams]
