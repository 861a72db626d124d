"""The test suite's own Redis: a real server on a free port, restartable, and a real 3-master cluster."""

from __future__ import annotations

import redis

from tests.support.redis_server import RedisCluster, RedisServer


def test_standalone_server_restarts_empty_on_same_port(redis_server: RedisServer) -> None:
    r = redis.Redis.from_url(redis_server.url)
    r.set("k", "v")
    assert r.get("k") == b"v"
    port = redis_server.port
    redis_server.restart()
    assert redis_server.port == port
    r2 = redis.Redis.from_url(redis_server.url)
    assert r2.get("k") is None
    r.close()
    r2.close()


def test_cluster_spreads_keys_over_three_masters(redis_cluster: RedisCluster) -> None:
    rc = redis.RedisCluster.from_url(redis_cluster.url)
    try:
        for i in range(30):
            rc.set(f"spread:{i}", i)
        owners = {rc.get_node_from_key(f"spread:{i}").port for i in range(30)}
        assert len(owners) == 3
        assert rc.get("spread:7") == b"7"
    finally:
        rc.close()
