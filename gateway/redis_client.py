"""One way to reach Redis from a ``GATEWAY_REDIS_URL``: a standalone server or a Redis Cluster.

- ``redis://[:password@]host:port/db`` (or ``rediss://`` for TLS): one server (or a Sentinel-managed
  primary behind a stable address).
- ``redis+cluster://[:password@]host:port`` (``rediss+cluster://`` for TLS): a Redis Cluster; any node
  works as the seed, redis-py discovers the others and follows MOVED/ASK.

Every feature that shares state (rate limits, admin overlay) takes the client built here from the
composition root; nothing else opens Redis connections.
"""

from __future__ import annotations

from typing import TypeAlias

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

AsyncRedis: TypeAlias = Redis | RedisCluster

_CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def is_cluster_url(url: str) -> bool:
    return url.split("://", 1)[0].lower() in _CLUSTER_SCHEMES


def connect(url: str, timeout_s: float, max_connections: int = 512) -> AsyncRedis:
    """A lazily connecting async client; every command is bounded by ``timeout_s``.

    Many requests at once share a bounded pool: a standalone client waits (up to ``timeout_s``) for a
    free connection instead of failing, a cluster client keeps up to ``max_connections`` per node.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"not a Redis URL: {url!r} (expected redis://host:port/0 or redis+cluster://host:port)")
    plain = _CLUSTER_SCHEMES.get(scheme.lower())
    if plain is not None:
        return RedisCluster.from_url(f"{plain}://{rest}", socket_timeout=timeout_s,
                                     socket_connect_timeout=timeout_s, max_connections=max_connections)
    pool = BlockingConnectionPool.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                           max_connections=max_connections, timeout=timeout_s,
                                           # a pooled connection that died with a Redis restart: one retry
                                           # on a fresh connection
                                           retry=Retry(NoBackoff(), 1), retry_on_error=[RedisConnectionError])
    return Redis.from_pool(pool)  # the client owns (and closes) the pool
