"""Exactness on a 3-master Redis Cluster started by the tests (``redis+cluster://`` URL): many keys spread
over the slots, two gateway instances, concurrent bursts."""

from __future__ import annotations

import asyncio
from collections import Counter

from redis.cluster import key_slot

from tests.fakes import FakeVLLM
from tests.integration.ratelimit_helpers import StartLimited, limited_config, start_limited
from tests.integration.test_ratelimit_redis import STRICT, burst
from tests.support.redis_server import RedisCluster

__all__ = ["start_limited"]


def _owner_ports(cluster: RedisCluster) -> dict[int, int]:
    """slot -> port of the master that owns it."""
    owners: dict[int, int] = {}
    for line in cluster.nodes[0].cli("CLUSTER", "NODES").splitlines():
        parts = line.split()
        if "master" not in parts[2]:
            continue
        port = int(parts[1].split("@")[0].rsplit(":", 1)[1])
        for rng in parts[8:]:
            lo, _, hi = rng.partition("-")
            for slot in range(int(lo), int(hi or lo) + 1):
                owners[slot] = port
    return owners


def test_cluster_burst_from_many_keys_is_exact_per_key(start_limited: StartLimited, fake: FakeVLLM,
                                                       redis_cluster: RedisCluster) -> None:
    names = [f"clu-{i}" for i in range(24)]  # the cluster lives for the session: names of this test only
    keys = [{"name": n, "key": f"sk-{n}", "rpm": 1, "burst_requests": 3} for n in names]
    owners = _owner_ports(redis_cluster)
    spread = Counter(owners[key_slot(f"{{k:{n}}}:rl:rq".encode())] for n in names)
    assert len(spread) == 3, spread  # the keys' buckets live on all three masters
    url = redis_cluster.url.replace("redis://", "redis+cluster://")
    cfg = limited_config(fake, extra_keys=keys, rate_limits=STRICT)
    g1, g2 = start_limited(cfg, url), start_limited(cfg, url)
    results = asyncio.run(burst([g1.url, g2.url], [f"sk-{n}" for n in names], 7))
    admitted = Counter(k for k, r in results if r.status_code == 200)
    refused = Counter(k for k, r in results if r.status_code == 429)
    assert admitted == Counter({f"sk-{n}": 3 for n in names})
    assert refused == Counter({f"sk-{n}": 4 for n in names})
    assert len(results) == 24 * 7


def test_cluster_model_wide_limit_in_its_own_slot(start_limited: StartLimited, fake: FakeVLLM,
                                                  redis_cluster: RedisCluster) -> None:
    names = [f"mod-{i}" for i in range(6)]
    # Each key may send 4, the model takes 10 in all: key buckets and the model bucket are in different
    # slots (two scripts, a refund when the second refuses), so the model limit is never exceeded.
    keys = [{"name": n, "key": f"sk-{n}", "rpm": 1, "burst_requests": 4} for n in names]
    url = redis_cluster.url.replace("redis://", "redis+cluster://")
    cfg = limited_config(fake, extra_keys=keys, rate_limits=STRICT, model={"rpm": 1, "burst_requests": 10})
    g1, g2 = start_limited(cfg, url), start_limited(cfg, url)
    results = asyncio.run(burst([g1.url, g2.url], [f"sk-{n}" for n in names], 6))
    admitted = Counter(k for k, r in results if r.status_code == 200)
    assert sum(admitted.values()) <= 10  # never more than the model-wide bucket
    assert all(v <= 4 for v in admitted.values())
    assert sum(admitted.values()) >= 6  # and refunds keep it from starving
    statuses = {r.status_code for _, r in results}
    assert statuses <= {200, 429}
    bodies = [r.json()["error"]["message"] for _, r in results if r.status_code == 429]
    assert any("on model public-chat" in m for m in bodies)
