from __future__ import annotations

import hashlib

import pytest

from gateway.auth.keys import StaticKeyStore, bearer_token
from gateway.config.schema import KeySpec
from gateway.errors import AuthenticationFailed


def test_bearer_parsing() -> None:
    assert bearer_token("Bearer sk-1") == "sk-1"
    assert bearer_token("bearer   sk-1 ") == "sk-1"
    assert bearer_token("sk-1") is None
    assert bearer_token("Basic abc") is None
    assert bearer_token("Bearer ") is None
    assert bearer_token(None) is None


def test_hashed_and_plain_keys_and_model_scopes() -> None:
    store = StaticKeyStore([
        KeySpec(name="a", key_sha256=hashlib.sha256(b"sk-a").hexdigest(), models=["m1"]),
        KeySpec.model_validate({"name": "b", "key": "sk-b"}),
    ])
    a = store.authenticate("Bearer sk-a")
    assert a.name == "a" and a.may_use("m1") and not a.may_use("m2")
    b = store.authenticate("Bearer sk-b")
    assert b.name == "b" and b.may_use("anything")
    with pytest.raises(AuthenticationFailed) as info:
        store.authenticate("Bearer sk-c")
    assert info.value.status == 401 and info.value.code == "invalid_api_key"
    with pytest.raises(AuthenticationFailed):
        store.authenticate(None)
