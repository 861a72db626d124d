"""Real ``redis-server`` processes for tests: one standalone server or a 3-master cluster, on free ports.

Never uses a Redis that happens to run on this machine: every server here is started by the test suite
with no persistence, in a temporary directory, and stopped (SIGTERM, then SIGKILL) at the end.
``make test`` installs the ``redis-server`` binary (Debian package ``redis-server``) when it is missing.

    with RedisServer.start() as r:
        r.url                    # redis://127.0.0.1:PORT/0
        r.restart()              # same port, empty data set (scripts flushed too): a Redis restart
        r.stop()                 # Redis down; r.start_again() brings it back on the same port

    with RedisCluster.start(masters=3) as c:
        c.url                    # redis://127.0.0.1:PORT0 (any node; redis-py discovers the rest)
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _cli(port: int, *args: str, timeout: float = 30) -> str:
    out = subprocess.run([REDIS_CLI, "-p", str(port), *args], capture_output=True, text=True,
                         timeout=timeout, check=True)
    return out.stdout


class RedisServer:
    """One ``redis-server`` on 127.0.0.1, no persistence; restartable on the same port."""

    def __init__(self, port: int, workdir: Path, extra: tuple[str, ...] = ()) -> None:
        self.port = port
        self.workdir = workdir
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @classmethod
    def start(cls, extra: tuple[str, ...] = ()) -> RedisServer:
        server = cls(free_port(), Path(tempfile.mkdtemp(prefix="gw-redis-")), extra)
        server.start_again()
        return server

    def start_again(self) -> None:
        assert self.proc is None, "already running"
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir), "--logfile", str(self.workdir / f"redis-{self.port}.log"),
             *self.extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 15
        while not _ping(self.port):
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}; see {self.workdir}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} not ready in 15 s")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None

    def restart(self) -> None:
        """A real restart: the process goes away, a new one with an empty data set takes the port."""
        self.stop()
        self.start_again()

    def cli(self, *args: str) -> str:
        return _cli(self.port, *args)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class RedisCluster:
    """A local Redis Cluster of N masters (no replicas), created with ``redis-cli --cluster create``."""

    def __init__(self, nodes: list[RedisServer]) -> None:
        self.nodes = nodes

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.nodes[0].port}"

    @classmethod
    def start(cls, masters: int = 3) -> RedisCluster:
        nodes: list[RedisServer] = []
        try:
            for _ in range(masters):
                # An explicit bus port: the default (port + 10000) overflows for high free ports.
                nodes.append(RedisServer.start(extra=(
                    "--cluster-enabled", "yes", "--cluster-node-timeout", "5000",
                    "--cluster-port", str(free_port()), "--cluster-config-file", "nodes.conf")))
            addrs = [f"127.0.0.1:{n.port}" for n in nodes]
            _cli(nodes[0].port, "--cluster", "create", *addrs, "--cluster-replicas", "0", "--cluster-yes",
                 timeout=60)
            cluster = cls(nodes)
            cluster.wait_ready()
            return cluster
        except BaseException:
            for n in nodes:
                n.close()
            raise

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if all("cluster_state:ok" in _cli(n.port, "cluster", "info") for n in self.nodes):
                return
            if time.monotonic() > deadline:
                raise RuntimeError("redis cluster did not reach cluster_state:ok")
            time.sleep(0.05)

    def close(self) -> None:
        for n in self.nodes:
            n.close()

    def __enter__(self) -> RedisCluster:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
