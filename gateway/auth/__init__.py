"""Client authentication."""

from gateway.auth.keys import Principal, StaticKeyStore, bearer_token, hash_key

__all__ = ["Principal", "StaticKeyStore", "bearer_token", "hash_key"]
