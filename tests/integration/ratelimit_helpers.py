"""Shared set-up for the rate-limit integration tests: configs with limits, gateways, waiting helpers."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from gateway.config import parse_config
from gateway.settings import Settings
from tests.fakes import FakeVLLM
from tests.integration.conftest import upstream
from tests.support.gateway_server import GatewayServer

KEY_A = "sk-team-a"
KEY_B = "sk-team-b"
FREE = "sk-free"
MSG = [{"role": "user", "content": "Hello"}]
CHAT = "/v1/chat/completions"

StartLimited = Callable[..., GatewayServer]


def limited_config(fake: FakeVLLM, *, a: dict[str, Any] | None = None, b: dict[str, Any] | None = None,
                   model: dict[str, Any] | None = None, rate_limits: dict[str, Any] | None = None,
                   extra_keys: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "models": [{"id": "public-chat", "upstreams": [upstream(fake, name="fake0")], **(model or {})}],
        "keys": [{"name": "team-a", "key": KEY_A, **(a or {})}, {"name": "team-b", "key": KEY_B, **(b or {})},
                 {"name": "free", "key": FREE}, *(extra_keys or [])],
        "health": {"interval_s": 30, "timeout_s": 2},
    }
    if rate_limits:
        cfg["rate_limits"] = rate_limits
    return cfg


@pytest.fixture
def start_limited() -> Iterator[StartLimited]:
    started: list[GatewayServer] = []

    def start(cfg: dict[str, Any], redis_url: str | None = None) -> GatewayServer:
        config = parse_config(yaml.safe_dump(cfg), {})
        server = GatewayServer(config, Settings(access_log=False, redis_url=redis_url)).start()
        started.append(server)
        return server

    yield start
    for s in started:
        s.stop()


def quiesce(gw: GatewayServer, timeout: float = 10.0) -> None:
    """Until no proxied request is in flight and every limiter give-back has run."""
    reg = gw.services.metrics.registry
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        busy = reg.get_sample_value("gateway_requests_in_flight", {"route": CHAT}) or 0
        if busy == 0 and gw.services.ratelimits.pending == 0:
            return
        time.sleep(0.005)
    raise AssertionError("gateway did not settle")


def freeze_clock(gw: GatewayServer, start: float = 1_000_000.0) -> list[float]:
    """Replace the in-memory limiter's clock with one the test moves (``now[0] += ms``)."""
    now = [start]
    gw.services.ratelimits.limiter.clock = lambda: now[0]
    return now


def metric(gw: GatewayServer, name: str, labels: dict[str, str]) -> float:
    return gw.services.metrics.registry.get_sample_value(name, labels) or 0.0
