"""Which limits a request of one key for one model touches, as a flat list of items.

An item is a token bucket (``requests``: one per request; ``tokens``: the estimate) or an in-flight
gate (``parallel``). Items of the key (its own and its per-model limits) share the key's Redis hash
tag ``{k:<name>}``; model-wide items are under ``{m:<model>}`` (another cluster slot).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gateway.config.schema import LimitSpec

Kind = Literal["requests", "tokens", "parallel"]
_MS_PER_MIN = 60_000.0


def _tag(text: str) -> str:
    """A name inside a hash tag: braces would end or move the tag, so they are escaped."""
    return text.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


@dataclass(frozen=True, slots=True)
class Item:
    key: str  # storage key (Redis key; the memory limiter's dict key)
    kind: Kind
    scope: str  # for messages: "key team-a", "key team-a for model big-70b", "model big-70b"
    limit: int  # the configured rpm / tpm / max_parallel
    capacity: int  # bucket size (burst) or max_parallel
    rate: float  # refill, per millisecond (0 for a gate)
    shared: bool  # model-wide: shared by every key (on a cluster: another slot)


# A header group: the (limit, remaining, reset) header names of one kind, and its candidate buckets as
# (index in items, limit, limit as header bytes, capacity, rate); the tightest one's values are sent.
HeaderGroup = tuple[tuple[bytes, bytes, bytes], tuple[tuple[int, int, bytes, int, float], ...]]
_HEADER_NAMES = {
    "requests": (b"x-ratelimit-limit-requests", b"x-ratelimit-remaining-requests", b"x-ratelimit-reset-requests"),
    "tokens": (b"x-ratelimit-limit-tokens", b"x-ratelimit-remaining-tokens", b"x-ratelimit-reset-tokens"),
}


@dataclass(frozen=True, slots=True)
class Plan:
    """Built once per (key, model) and configuration snapshot; everything a request needs precomputed."""

    key_name: str
    model: str
    items: tuple[Item, ...]
    token_capacity: int | None  # the smallest tokens bucket: a bigger estimate can never fit
    has_tokens: bool
    has_gates: bool
    token_mask: tuple[bool, ...] = ()  # per item: a tokens bucket (costs the estimate; others cost 1)
    unit_costs: tuple[int, ...] = ()  # all 1: the costs when there is no tokens bucket
    header_groups: tuple[HeaderGroup, ...] = ()
    # When every header kind has one bucket (the usual case): per kind (limit, remaining, reset header
    # names, item index, limit as header bytes, capacity, rate), flat; None otherwise
    header_single: tuple[tuple[bytes, bytes, bytes, int, bytes, int, float], ...] | None = None

    def costs(self, estimate: int) -> tuple[int, ...]:
        if not self.has_tokens:
            return self.unit_costs
        return tuple([estimate if t else 1 for t in self.token_mask])

    def refunds(self, delta: int) -> tuple[int, ...]:
        return tuple([delta if t else 0 for t in self.token_mask])


def _items(spec: LimitSpec, prefix: str, scope: str, shared: bool) -> list[Item]:
    out: list[Item] = []
    if spec.rpm is not None:
        cap = spec.burst_requests or spec.rpm
        out.append(Item(f"{prefix}:rq", "requests", scope, spec.rpm, cap, spec.rpm / _MS_PER_MIN, shared))
    if spec.tpm is not None:
        cap = spec.burst_tokens or spec.tpm
        out.append(Item(f"{prefix}:tk", "tokens", scope, spec.tpm, cap, spec.tpm / _MS_PER_MIN, shared))
    if spec.max_parallel is not None:
        out.append(Item(f"{prefix}:pl", "parallel", scope, spec.max_parallel, spec.max_parallel, 0.0, shared))
    return out


def build_plan(key_name: str, model: str, key: LimitSpec | None, key_model: LimitSpec | None,
               model_wide: LimitSpec | None) -> Plan | None:
    """The plan, or None when nothing limits this pair (then the request costs no limiter work)."""
    k = f"{{k:{_tag(key_name)}}}:rl"
    items: list[Item] = []
    if key is not None:
        items += _items(key, k, f"key {key_name}", False)
    if key_model is not None:
        items += _items(key_model, f"{k}:{_tag(model)}", f"key {key_name} for model {model}", False)
    if model_wide is not None:
        items += _items(model_wide, f"{{m:{_tag(model)}}}:rl", f"model {model}", True)
    if not items:
        return None
    caps = [i.capacity for i in items if i.kind == "tokens"]
    groups: list[HeaderGroup] = []
    for kind in ("requests", "tokens"):
        cands = tuple((n, i.limit, b"%d" % i.limit, i.capacity, i.rate) for n, i in enumerate(items) if i.kind == kind)
        if cands:
            groups.append((_HEADER_NAMES[kind], cands))
    single = None
    if all(len(cands) == 1 for _names, cands in groups):
        single = tuple((*names, n, limit_b, cap, rate) for names, ((n, _limit, limit_b, cap, rate),) in groups)
    return Plan(key_name, model, tuple(items), min(caps) if caps else None, bool(caps),
                any(i.kind == "parallel" for i in items), tuple(i.kind == "tokens" for i in items),
                (1,) * len(items), tuple(groups), single)


def key_tag(key_name: str) -> str:
    """The hash tag of everything stored for one client key (limits and usage)."""
    return f"{{k:{_tag(key_name)}}}"
