"""Integration fixtures: the gateway on real uvicorn in front of fake vLLM servers on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
import yaml

from gateway.config import parse_config
from gateway.settings import Settings
from tests.fakes import FakeVLLM
from tests.fakes.plugin import FakeVLLMFactory
from tests.support.gateway_server import GatewayServer

CLIENT_KEY = "sk-client-test"
LIMITED_KEY = "sk-limited-test"
BACKEND_KEY = "sk-backend-test"

GatewayFactory = Callable[..., GatewayServer]


def upstream(fake: FakeVLLM, *, name: str | None = None, model: str = "tiny", api_key: str | None = BACKEND_KEY,
             **extra: Any) -> dict[str, Any]:
    u: dict[str, Any] = {"url": fake.url + "/v1", "model": model, **extra}
    if name:
        u["name"] = name
    if api_key is not None:
        u["api_key"] = api_key
    return u


def config_dict(models: dict[str, list[dict[str, Any]]], **top: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "models": [{"id": mid, "upstreams": ups} for mid, ups in models.items()],
        "keys": [
            {"name": "full", "key": CLIENT_KEY},
            {"name": "limited", "key": LIMITED_KEY, "models": [next(iter(models))]},
        ],
        "health": {"interval_s": 30, "timeout_s": 2},
    }
    cfg.update(top)
    return cfg


@pytest.fixture
def start_gateway() -> Iterator[GatewayFactory]:
    started: list[GatewayServer] = []

    def start(models: dict[str, list[dict[str, Any]]], **top: Any) -> GatewayServer:
        config = parse_config(yaml.safe_dump(config_dict(models, **top)), {})
        server = GatewayServer(config, Settings(access_log=True)).start()
        started.append(server)
        return server

    yield start
    for s in started:
        s.stop()


@pytest.fixture
def fake(fake_vllm: FakeVLLMFactory) -> FakeVLLM:
    return fake_vllm()


@pytest.fixture
def gw(start_gateway: GatewayFactory, fake: FakeVLLM) -> GatewayServer:
    """One public model `public-chat` served by one fake backend serving `tiny`."""
    return start_gateway({"public-chat": [upstream(fake, name="fake0")]})


@pytest.fixture
def client(gw: GatewayServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gw.url + "/v1", api_key=CLIENT_KEY, max_retries=0, timeout=20) as c:
        yield c


@pytest.fixture
def http(gw: GatewayServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {CLIENT_KEY}"}, timeout=20) as c:
        yield c
