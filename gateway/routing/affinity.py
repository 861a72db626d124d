"""Session affinity: the same key goes to the same upstream, by rendezvous (highest random weight) hashing.

Every upstream gets a pseudo-random score from ``hash(key, upstream name)``; the highest score among
the candidates wins. Removing an upstream moves only the keys it was winning (each to its runner-up);
adding one takes only the keys it now wins. Weights scale an upstream's share (weighted rendezvous:
``-weight / ln(u)`` with ``u`` uniform in (0, 1)). No ring to rebuild when the model table changes.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.domain import Upstream

_SCALE = float(1 << 64)


def _score(key: bytes, up: Upstream) -> float:
    h = int.from_bytes(hashlib.blake2b(key + b"\x00" + up.name.encode(), digest_size=8).digest(), "big")
    u = (h + 0.5) / _SCALE  # in (0, 1), never 0 or 1
    return -max(up.weight, 1) / math.log(u)


def rank(key: str, ups: Sequence[Upstream]) -> list[Upstream]:
    """``ups`` ordered by rendezvous score for ``key``, the sticky one first."""
    k = key.encode("utf-8", "surrogatepass")
    return sorted(ups, key=lambda u: _score(k, u), reverse=True)


def pick(key: str, ups: Sequence[Upstream]) -> Upstream:
    k = key.encode("utf-8", "surrogatepass")
    return max(ups, key=lambda u: _score(k, u))


MAX_KEY_CHARS = 512  # a longer key is cut (it only has to be stable, not whole)


def affinity_key(source: str | None, headers: Sequence[tuple[bytes, bytes]],
                 payload: Mapping[str, Any]) -> str | None:
    """The request's session key for a model's ``affinity`` setting, or None (then no affinity).

    ``header:<name>``: that request header (the first one, if repeated). ``user``: the body's ``user``
    field (OpenAI), else ``metadata.user_id`` (Anthropic's equivalent).
    """
    if source is None:
        return None
    if source == "user":
        v = payload.get("user")
        if not isinstance(v, str):
            meta = payload.get("metadata")
            v = meta.get("user_id") if isinstance(meta, dict) else None
        return v[:MAX_KEY_CHARS] if isinstance(v, str) and v else None
    name = source.partition(":")[2].encode("latin-1")
    for k, v in headers:
        if k.lower() == name:
            text = v.decode("latin-1").strip()
            return text[:MAX_KEY_CHARS] or None
    return None


__all__ = ["affinity_key", "pick", "rank"]
