"""Client keys: bearer parsing and constant-time lookup against SHA-256 hashes.

Keys are only ever held hashed. A presented key is hashed once and compared with every stored
hash using :func:`hmac.compare_digest`, without an early exit, so timing says nothing about which
(or whether a) stored key is near the presented one.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gateway.config.schema import KeySpec, LimitSpec
from gateway.errors import AuthenticationFailed


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the key's name (never the key) and the public models it may use."""

    name: str
    models: frozenset[str] | None  # None: every model ("*")
    limits: LimitSpec | None = None  # the key's own rate limits; None: unlimited
    per_model: Mapping[str, LimitSpec] = field(default_factory=lambda: MappingProxyType({}))

    def may_use(self, model_id: str) -> bool:
        return self.models is None or model_id in self.models


KEY_PREFIX = "sk-gw-"


def new_key() -> str:
    """A fresh client key (``gateway keys new`` and ``POST /admin/keys`` make them the same way)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def bearer_token(authorization: str | None) -> str | None:
    """``Bearer <key>`` (scheme case-insensitive) -> ``<key>``; anything else -> None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = token.strip()
    return token or None


class StaticKeyStore:
    """Keys from the config file."""

    def __init__(self, specs: Iterable[KeySpec]) -> None:
        entries: list[tuple[bytes, Principal]] = []
        for spec in specs:
            if spec.key_sha256 is not None:
                digest = spec.key_sha256
            else:
                assert spec.key is not None
                digest = hash_key(spec.key.get_secret_value())
            models = None if "*" in spec.models else frozenset(spec.models)
            limits = spec.only_limits() if spec.limited() else None
            per_model = MappingProxyType({m: lim for m, lim in spec.per_model.items() if lim.limited()})
            entries.append((bytes.fromhex(digest), Principal(spec.name, models, limits, per_model)))
        self._entries = tuple(entries)

    def authenticate(self, authorization: str | None) -> Principal:
        token = bearer_token(authorization)
        if token is None:
            raise AuthenticationFailed(
                "Missing API key. Send it as `Authorization: Bearer <key>` "
                "(the openai SDK does this when you pass api_key=...)."
            )
        digest = hashlib.sha256(token.encode("utf-8")).digest()
        found: Principal | None = None
        for stored, principal in self._entries:
            if hmac.compare_digest(stored, digest) and found is None:
                found = principal
        if found is None:
            raise AuthenticationFailed("Incorrect API key provided.")
        return found
