"""An immutable snapshot of the model mapping: public model ID -> upstreams.

Requests resolve against one snapshot from start to end; a new mapping is a new snapshot.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from gateway.config.schema import GatewayConfig, ModelSpec
from gateway.domain import ModelEntry, Upstream
from gateway.errors import ModelNotFound


def _max_model_len(m: ModelSpec) -> int | None:
    lens = [u.launch.max_model_len for u in m.upstreams if u.launch and u.launch.max_model_len]
    return min(lens) if lens else None


class Caller(Protocol):
    """Who asks (an authenticated key): only which public models it may use matters here."""

    def may_use(self, model_id: str) -> bool: ...


@dataclass(frozen=True, slots=True)
class ModelTable:
    entries: dict[str, ModelEntry]
    version: int = 1
    aliases: dict[str, str] = field(default_factory=dict)  # alias -> public model ID

    @classmethod
    def from_config(cls, config: GatewayConfig, created: int | None = None, version: int = 1,
                    previous: ModelTable | None = None) -> ModelTable:
        """``previous``: the table this one replaces (an entry that stays keeps its ``created``)."""
        ts = int(time.time()) if created is None else created
        before = previous.entries if previous is not None else {}
        entries = {
            m.id: ModelEntry(m.id, tuple(Upstream.from_spec(m.id, u) for u in m.upstreams), m.owned_by,
                             before[m.id].created if m.id in before else ts,
                             m.only_limits() if m.limited() else None, _max_model_len(m), tuple(m.aliases),
                             m.routing, m.affinity, m.shed, tuple(m.fallbacks))
            for m in config.models
        }
        return cls(entries, version, aliases={a: m.id for m in config.models for a in m.aliases})

    def visible_to(self, principal: Caller) -> list[ModelEntry]:
        return [e for e in self.entries.values() if principal.may_use(e.id)]

    def resolve(self, model_id: str, principal: Caller) -> ModelEntry:
        """The entry for ``model_id`` (a public ID or an alias) if this key may use it; otherwise one
        and the same 404."""
        entry = self.entries.get(model_id)
        if entry is None and self.aliases:
            entry = self.entries.get(self.aliases.get(model_id, ""))
        if entry is None or not principal.may_use(entry.id):
            visible = ", ".join(e.id for e in self.visible_to(principal)) or "none"
            raise ModelNotFound(
                f"The model `{model_id}` does not exist or you do not have access to it. "
                f"Models available to this key: {visible}.",
                param="model",
            )
        return entry

    def fallbacks_of(self, entry: ModelEntry) -> tuple[ModelEntry, ...]:
        """The entries ``entry`` falls back to, in order, from this same snapshot. Fallbacks are the
        operator's choice: the caller's key needs access to the model it asked for, not to these."""
        return tuple(self.entries[f] for f in entry.fallbacks if f in self.entries)

    def upstreams(self) -> list[Upstream]:
        return [u for e in self.entries.values() for u in e.upstreams]
