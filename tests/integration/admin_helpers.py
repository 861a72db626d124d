"""Shared pieces of the admin API tests: a gateway with an admin key on a file or Redis store."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.auth.keys import hash_key
from gateway.config import parse_config
from gateway.settings import Settings
from tests.fakes import FakeVLLM
from tests.integration.conftest import BACKEND_KEY, CLIENT_KEY
from tests.support.gateway_server import GatewayServer
from tests.support.redis_server import RedisServer

ADMIN_KEY = "adm-env-secret-0123456789"
CONFIG_ADMIN_KEY = "adm-config-secret-abcdef"

StartAdmin = Callable[..., GatewayServer]


def admin_config(fake: FakeVLLM, **top: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "models": [{"id": "public-chat", "upstreams": [
            {"name": "fake0", "url": fake.url, "model": "tiny", "api_key": BACKEND_KEY}]}],
        "keys": [{"name": "full", "key": CLIENT_KEY}],
        "health": {"interval_s": 30, "timeout_s": 2},
        "admin": {"keys": [{"name": "ops", "key_sha256": hash_key(CONFIG_ADMIN_KEY)}]},
    }
    cfg.update(top)
    return cfg


class Store:
    """Where a test's gateways keep the overlay: ``file`` (a path) or ``redis`` (a URL)."""

    def __init__(self, kind: str, tmp: Path, redis: RedisServer | None) -> None:
        self.kind = kind
        self.state_file = tmp / "state" / "gateway-state.json"
        self.state_file.parent.mkdir(exist_ok=True)
        self.redis = redis

    def settings(self, **extra: Any) -> Settings:
        base: dict[str, Any] = {"access_log": False, "admin_key": ADMIN_KEY, "state_file": self.state_file}
        if self.kind == "redis":
            assert self.redis is not None
            base["redis_url"] = self.redis.url
        base.update(extra)
        return Settings(**base)


@pytest.fixture(params=["file", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    redis = request.getfixturevalue("redis_server") if request.param == "redis" else None
    return Store(request.param, tmp_path, redis)


@pytest.fixture
def start_admin(store: Store) -> Iterator[StartAdmin]:
    started: list[GatewayServer] = []

    def start(cfg: dict[str, Any], **settings: Any) -> GatewayServer:
        config = parse_config(yaml.safe_dump(cfg), {})
        gw = GatewayServer(config, store.settings(**settings)).start()
        started.append(gw)
        return gw

    yield start
    for gw in started:
        gw.stop()


def admin(gw: GatewayServer, key: str = ADMIN_KEY) -> httpx.Client:
    return httpx.Client(base_url=gw.url + "/admin", headers={"Authorization": f"Bearer {key}"}, timeout=20,
                        trust_env=False)


def chat(gw: GatewayServer, model: str, key: str = CLIENT_KEY) -> httpx.Response:
    return httpx.post(gw.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                      json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                      timeout=20, trust_env=False)


def model_body(model_id: str, fake: FakeVLLM, name: str = "up-a", served: str = "tiny",
               **extra: Any) -> dict[str, Any]:
    return {"id": model_id, "upstreams": [{"name": name, "url": fake.url, "model": served,
                                           "api_key": BACKEND_KEY}], **extra}
