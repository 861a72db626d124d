"""Pytest fixtures for a real Redis started by the test suite (see ``tests.support.redis_server``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.redis_server import RedisCluster, RedisServer


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A fresh standalone ``redis-server`` per test (starting one takes a few milliseconds)."""
    with RedisServer.start() as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    """One 3-master Redis Cluster for the session; tests keep to their own key names."""
    with RedisCluster.start(masters=3) as cluster:
        yield cluster
