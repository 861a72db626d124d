"""Admin keys: separate from client keys, held only as SHA-256, compared in constant time.

``GATEWAY_ADMIN_KEY`` (named ``env``) and the config's ``admin.keys``. No admin key at all: the admin
API is off (every /admin route answers 404), never open.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from gateway.auth.keys import StaticKeyStore, bearer_token
from gateway.config.schema import AdminKeySpec
from gateway.errors import AuthenticationFailed, GatewayError, PermissionDenied


class AdminKeys:
    def __init__(self, specs: Sequence[AdminKeySpec], env_key: str | None = None) -> None:
        self._env = hashlib.sha256(env_key.encode("utf-8")).digest() if env_key else None
        self._specs: Sequence[AdminKeySpec] = ()
        self._entries: tuple[tuple[str, bytes], ...] = ()
        self.refresh(specs)

    def refresh(self, specs: Sequence[AdminKeySpec]) -> None:
        """The config's ``admin.keys`` as served now (a reload may change them)."""
        if specs is self._specs:
            return
        entries = [(s.name, bytes.fromhex(s.key_sha256)) for s in specs]
        if self._env is not None:
            entries.append(("env", self._env))
        self._specs, self._entries = specs, tuple(entries)

    @property
    def enabled(self) -> bool:
        return bool(self._entries)

    def authenticate(self, authorization: str | None, client_keys: StaticKeyStore) -> str:
        """The admin key's name; 401 without a key or with an unknown one, 403 with a client key."""
        token = bearer_token(authorization)
        if token is None:
            raise AuthenticationFailed("Missing admin key. Send it as `Authorization: Bearer <admin key>`.")
        digest = hashlib.sha256(token.encode("utf-8")).digest()
        found: str | None = None
        for name, stored in self._entries:
            if hmac.compare_digest(stored, digest) and found is None:
                found = name
        if found is not None:
            return found
        try:
            client_keys.authenticate(authorization)
        except GatewayError:
            raise AuthenticationFailed("Incorrect admin key provided.") from None
        raise PermissionDenied("This is a client key; the admin API needs an admin key.")
