"""Rate limits shared through a real redis-server: exact across gateway instances, Redis restarts,
SCRIPT FLUSH, Redis down (fail_open / fail_closed), Redis slow, usage counters and `gateway usage`."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from tests.fakes import FakeVLLM
from tests.integration.ratelimit_helpers import (
    CHAT,
    KEY_A,
    KEY_B,
    MSG,
    StartLimited,
    limited_config,
    metric,
    quiesce,
    start_limited,
)
from tests.support.gateway_server import GatewayServer
from tests.support.redis_server import RedisServer

__all__ = ["start_limited"]

STRICT = {"redis_failure": "fail_closed", "redis_timeout_ms": 5000}  # a Redis failure shows as a 503


def post(url: str, key: str = KEY_A) -> httpx.Response:
    return httpx.post(url + CHAT, json={"model": "public-chat", "messages": MSG, "max_tokens": 2},
                      headers={"Authorization": f"Bearer {key}"}, timeout=30)


async def burst(urls: list[str], keys: list[str], per_key: int) -> list[tuple[str, httpx.Response]]:
    """``per_key`` concurrent requests for every key, spread round-robin over the gateways."""
    limits = httpx.Limits(max_connections=400, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=60, limits=limits) as c:
        async def one(i: int, key: str) -> tuple[str, httpx.Response]:
            r = await c.post(urls[i % len(urls)] + CHAT, headers={"Authorization": f"Bearer {key}"},
                             json={"model": "public-chat", "messages": MSG, "max_tokens": 1})
            return key, r

        return await asyncio.gather(*(one(i, k) for k in keys for i in range(per_key)))


def test_burst_across_two_gateways_on_one_redis_admits_exactly_the_bucket(
        start_limited: StartLimited, fake: FakeVLLM, redis_server: RedisServer) -> None:
    cfg = limited_config(fake, a={"rpm": 1, "burst_requests": 20}, rate_limits=STRICT)
    g1, g2 = start_limited(cfg, redis_server.url), start_limited(cfg, redis_server.url)
    results = asyncio.run(burst([g1.url, g2.url], ["sk-team-a"], 60))
    statuses = sorted(r.status_code for _, r in results)
    assert statuses == [200] * 20 + [429] * 40
    for _, r in results:
        if r.status_code == 429:
            err = r.json()["error"]
            assert err["type"] == "requests" and err["code"] == "rate_limit_exceeded" and err["param"] is None
            assert err["message"].startswith(
                "Rate limit reached for requests (rpm) on key team-a: Limit 1, Used 20, Requested 1. "
                "Please try again in ")
            assert 1 <= int(r.headers["retry-after"]) <= 60 and 0 < int(r.headers["retry-after-ms"]) <= 60_000
            assert r.headers["x-ratelimit-limit-requests"] == "1"
            assert r.headers["x-ratelimit-remaining-requests"] == "0"
    assert len(fake.requests_to(CHAT)) == 20
    # both instances served part of the admitted ones, and every refusal was counted where it happened
    refused = sum(metric(g, "gateway_rate_limited_total", {"key": "team-a", "kind": "requests"}) for g in (g1, g2))
    assert refused == 40


def test_redis_restart_and_script_flush_mid_run(start_limited: StartLimited, fake: FakeVLLM,
                                                redis_server: RedisServer) -> None:
    gw = start_limited(limited_config(fake, a={"rpm": 1, "burst_requests": 3}, rate_limits=STRICT),
                       redis_server.url)
    assert [post(gw.url).status_code for _ in range(2)] == [200, 200]
    redis_server.cli("SCRIPT", "FLUSH")  # scripts gone, buckets kept: EVALSHA -> NOSCRIPT -> reload
    assert [post(gw.url).status_code for _ in range(2)] == [200, 429]
    redis_server.restart()  # a new, empty Redis: buckets start full again, scripts are reloaded
    assert [post(gw.url).status_code for _ in range(4)] == [200, 200, 200, 429]


@pytest.mark.parametrize("policy", ["fail_open", "fail_closed"])
def test_redis_down_follows_the_policy_and_comes_back_without_a_restart(
        start_limited: StartLimited, fake: FakeVLLM, redis_server: RedisServer, policy: str) -> None:
    gw = start_limited(limited_config(fake, a={"rpm": 1, "burst_requests": 2},
                                      rate_limits={"redis_failure": policy, "redis_timeout_ms": 500}),
                       redis_server.url)
    assert post(gw.url).status_code == 200
    redis_server.stop()
    t0 = time.monotonic()
    r = post(gw.url)
    assert time.monotonic() - t0 < 5
    if policy == "fail_open":
        assert r.status_code == 200 and "x-ratelimit-limit-requests" not in r.headers
        assert [post(gw.url).status_code for _ in range(3)] == [200] * 3  # unlimited while Redis is away
    else:
        assert r.status_code == 503
        assert r.json()["error"]["code"] == "rate_limiter_unavailable"
        assert "fail_closed" in r.json()["error"]["message"]
    assert metric(gw, "gateway_rate_limiter_errors_total", {}) >= 1
    # authentication never depends on Redis
    bad = httpx.post(gw.url + CHAT, json={"model": "public-chat", "messages": MSG},
                     headers={"Authorization": "Bearer sk-wrong"})
    assert bad.status_code == 401
    assert post(gw.url, "sk-free").status_code == 200  # a key without limits never touches Redis
    redis_server.start_again()  # empty: the bucket is full again, and used at once
    assert [post(gw.url).status_code for _ in range(3)] == [200, 200, 429]


@pytest.mark.parametrize("policy", ["fail_open", "fail_closed"])
def test_slow_redis_costs_at_most_redis_timeout_ms(start_limited: StartLimited, fake: FakeVLLM,
                                                   redis_server: RedisServer, policy: str) -> None:
    gw = start_limited(limited_config(fake, a={"rpm": 100}, rate_limits={"redis_failure": policy,
                                                                           "redis_timeout_ms": 300}),
                       redis_server.url)
    assert post(gw.url).status_code == 200
    redis_server.cli("CLIENT", "PAUSE", "4000", "ALL")
    try:
        t0 = time.monotonic()
        r = post(gw.url)
        took = time.monotonic() - t0
        assert r.status_code == (200 if policy == "fail_open" else 503)
        assert took < 3.0, took  # bounded by the 0.3 s budget (plus a loaded machine), not the 4 s pause
    finally:
        redis_server.cli("CLIENT", "UNPAUSE")
    quiesce(gw)
    assert post(gw.url).status_code == 200 and post(gw.url).headers["x-ratelimit-limit-requests"] == "100"


def _hash(server: RedisServer, key: str) -> dict[str, str]:
    out = server.cli("--raw", "HGETALL", key).split("\n")
    return dict(zip(out[0::2], out[1::2], strict=False))


def test_usage_counters_in_redis_and_the_usage_command(start_limited: StartLimited, fake: FakeVLLM,
                                                       redis_server: RedisServer, tmp_path: Path) -> None:
    cfg = limited_config(fake, a={"rpm": 1, "burst_requests": 2}, rate_limits=STRICT)
    gw = start_limited(cfg, redis_server.url)
    assert [post(gw.url).status_code for _ in range(3)] == [200, 200, 429]
    body = {"model": "public-chat", "messages": MSG, "max_tokens": 3, "stream": True}
    with httpx.stream("POST", gw.url + CHAT, json=body, headers={"Authorization": f"Bearer {KEY_B}"}) as r:
        r.read()
    day = time.strftime("%Y-%m-%d", time.gmtime())
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:  # written in batches every 2 s
        a, b = _hash(redis_server, f"{{k:team-a}}:use:{day}"), _hash(redis_server, f"{{k:team-b}}:use:{day}")
        if sum(int(v) for f, v in a.items() if f.endswith("|rl")) == 1 and b:
            break
        time.sleep(0.1)
    assert int(redis_server.cli("TTL", f"{{k:team-a}}:use:{day}").strip()) > 89 * 86400
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "GATEWAY_REDIS_URL": redis_server.url}
    out = subprocess.run([sys.executable, "-m", "gateway", "usage", "--config", str(path), "--days", "30",
                          "--json"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    rows: list[dict[str, Any]] = orjson.loads(out.stdout)
    assert rows == [
        {"day": day, "key": "team-a", "model": "public-chat", "requests": 2, "prompt_tokens": 20,
         "completion_tokens": 4, "rate_limited": 1},
        {"day": day, "key": "team-b", "model": "public-chat", "requests": 1, "prompt_tokens": 10,
         "completion_tokens": 3, "rate_limited": 0},
    ]
    table = subprocess.run([sys.executable, "-m", "gateway", "usage", "--config", str(path), "--key", "team-b"],
                           capture_output=True, text=True, env=env, timeout=60)
    assert table.returncode == 0 and "team-b" in table.stdout and "team-a" not in table.stdout
    assert table.stdout.splitlines()[0].split() == ["day", "key", "model", "requests", "prompt_tokens",
                                                    "completion_tokens", "rate_limited"]
    no_redis = subprocess.run([sys.executable, "-m", "gateway", "usage", "--config", str(path)],
                              capture_output=True, text=True, timeout=60,
                              env={k: v for k, v in os.environ.items() if k != "GATEWAY_REDIS_URL"})
    assert no_redis.returncode == 2 and "GATEWAY_REDIS_URL" in no_redis.stderr


def test_keys_without_limits_never_call_redis(start_limited: StartLimited, fake: FakeVLLM,
                                              redis_server: RedisServer) -> None:
    gw: GatewayServer = start_limited(limited_config(fake), redis_server.url)
    for _ in range(20):
        assert post(gw.url).status_code == 200
    stats = redis_server.cli("INFO", "commandstats")
    assert "cmdstat_evalsha" not in stats and "cmdstat_eval:" not in stats  # no limiter call at all
    deadline = time.monotonic() + 15
    while "cmdstat_hincrby" not in (stats := redis_server.cli("INFO", "commandstats")):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    calls = int(stats.split("cmdstat_hincrby:calls=")[1].split(",")[0])
    assert calls < 20  # usage is written in batches, not per request
