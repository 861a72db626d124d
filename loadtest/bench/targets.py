"""The processes under test, each started on a free 127.0.0.1 port and polled until it answers.

- the stub (`loadtest/upstream_stub.py`): the fast vLLM-like upstream everything relays to;
- the gateway (`gateway serve`, generated config, access log off unless asked);
- the Python floor (`loadtest/floor_relay.py`);
- nginx (Debian's nginx-light, installed by `scripts/install_nginx.sh` when missing; skipped with a
  message when that fails): one worker, `proxy_buffering off`, an upstream keep-alive pool.

Pinning (Linux, 2+ CPUs): every proxy on the last CPU, the stub and the load generator on the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httptools

from loadtest.bench.loadgen import HttpConn, perf
from loadtest.bench.scenarios import CLIENT_KEY, HOST, PUBLIC_MODEL, SERVED_MODEL, STUB_KEY, http_request

ROOT = Path(__file__).resolve().parents[2]
STUB_SCRIPT = ROOT / "loadtest" / "upstream_stub.py"
FLOOR_SCRIPT = ROOT / "loadtest" / "floor_relay.py"
INSTALL_NGINX = ROOT / "scripts" / "install_nginx.sh"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def _child_setup(cpus: frozenset[int] | None) -> Callable[[], None]:
    def setup() -> None:
        """In the child (Linux): get SIGTERM when the benchmark dies, even by SIGKILL; pin to `cpus`."""
        with contextlib.suppress(Exception):
            ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if cpus:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, cpus)

    return setup


class Procs:
    """Child processes, stopped (TERM, then KILL) in reverse order by ``stop_all``."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, cmd: list[str], env: dict[str, str] | None = None,
              cpus: frozenset[int] | None = None, cwd: Path = ROOT) -> subprocess.Popen[bytes]:  # fmt: skip
        log = (self.logdir / f"{name}.log").open("wb")
        try:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                preexec_fn=_child_setup(cpus) if sys.platform == "linux" else None,
            )
        finally:
            log.close()
        self.procs.append((name, proc))
        return proc

    def log_tail(self, name: str, lines: int = 30) -> str:
        try:
            text = (self.logdir / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop_all(self) -> None:
        for _name, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _name, proc in reversed(self.procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self.procs.clear()


# Limits that never refuse in a benchmark (the cost of checking them is what is measured): every
# bucket a request touches (rpm, tpm, max_parallel) is exercised, none ever runs dry.
BENCH_LIMITS = {"rpm": 1_000_000_000, "tpm": 1_000_000_000_000, "max_parallel": 1_000_000}


def gateway_config(stub_port: int, limits: bool = False) -> dict[str, Any]:
    return {
        "models": [{
            "id": PUBLIC_MODEL,
            # max_connections as the floor's aiohttp pool (1,024): case E's 1,000 streams run at once
            "upstreams": [{"name": "stub", "url": f"http://{HOST}:{stub_port}", "model": SERVED_MODEL,
                           "api_key": STUB_KEY, "max_connections": 1024}],
        }],
        "keys": [{"name": "bench", "key": CLIENT_KEY, **(BENCH_LIMITS if limits else {})}],
        # A saturated 2-CPU machine delays the event loop past the default 50 ms, and a Redis call that
        # "fails open" skips the work being measured: give it 5 s (failures are counted and printed).
        **({"rate_limits": {"redis_timeout_ms": 5000}} if limits else {}),
        "health": {"interval_s": 30},
        # The stub's per-request delay header must reach it (client headers are allow-listed).
        "forward_headers": {"allow": ["user-agent", "accept", "x-stub-token-delay-ms"]},
    }


def gateway_cmd() -> list[str]:
    script = Path(sys.executable).parent / "gateway"
    return [str(script)] if script.exists() else [sys.executable, "-m", "gateway"]


def gateway_env(redis_url: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update({"GATEWAY_LOG_LEVEL": "warning", "GATEWAY_ACCESS_LOG": "false", "GATEWAY_LOG_FORMAT": "text",
                "GATEWAY_GRACEFUL_SHUTDOWN_S": "2"})
    if redis_url:
        env["GATEWAY_REDIS_URL"] = redis_url
    return env


async def wait_ready(name: str, proc: subprocess.Popen[bytes], port: int, requests: list[bytes],
                     procs: Procs, timeout_s: float = 60.0) -> float:
    """Poll until every request answers 200 (in order); fail early if the process exits."""
    t0 = perf()
    deadline = t0 + timeout_s
    pending = list(requests)
    last = "no answer yet"
    while pending:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{procs.log_tail(name)}")
        if perf() > deadline:
            raise RuntimeError(f"{name} not ready after {timeout_s:g}s ({last}):\n{procs.log_tail(name)}")
        try:
            conn = await HttpConn.open(port)
            try:
                async with asyncio.timeout(5):
                    status, body = await conn.exchange(pending[0])
            finally:
                conn.close()
            if status == 200:
                pending.pop(0)
                continue
            last = f"status {status}: {body[:200]!r}"
        except (OSError, TimeoutError, httptools.HttpParserError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        await asyncio.sleep(0.05)  # poll interval
    return perf() - t0


@dataclass(frozen=True)
class Pinning:
    proxies: frozenset[int] | None  # CPUs of the proxy under test
    load: frozenset[int] | None  # CPUs of the stub and the load generator


def plan_pinning(enabled: bool) -> Pinning:
    if not enabled or not hasattr(os, "sched_getaffinity"):
        return Pinning(None, None)
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return Pinning(None, None)
    return Pinning(frozenset(cpus[-1:]), frozenset(cpus[:-1]))


@dataclass
class Started:
    name: str
    port: int
    proc: subprocess.Popen[bytes]
    pids: list[int]  # the processes whose CPU counts (nginx: its worker)


def start_stub(procs: Procs, pin: Pinning) -> Started:
    port = free_port()
    proc = procs.start("stub", [sys.executable, str(STUB_SCRIPT), "--port", str(port), "--api-key", STUB_KEY,
                                "--served-name", SERVED_MODEL], cpus=pin.load)
    return Started("stub", port, proc, [proc.pid])


def start_gateway(procs: Procs, pin: Pinning, stub_port: int, tmp: Path, redis_url: str | None,
                  access_log: bool, name: str = "gateway", limits: bool = False,
                  wrapper: list[str] | None = None, src: Path | None = None) -> Started:  # fmt: skip
    """A gateway; ``limits``: the bench key gets BENCH_LIMITS (in memory, or in Redis with ``redis_url``);
    ``wrapper``: a command to run it under (valgrind); ``src``: a directory holding another revision's
    ``gateway`` package, run instead of this checkout's (same interpreter and libraries)."""
    port = free_port()
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(json.dumps(gateway_config(stub_port, limits), indent=2))  # JSON is YAML
    env = gateway_env(redis_url)
    env["GATEWAY_ACCESS_LOG"] = "true" if access_log else "false"
    # ``python -m gateway`` run in ``src`` imports the package found there first (the current directory
    # comes before the editable install on sys.path).
    cmd = [sys.executable, "-m", "gateway"] if src is not None else gateway_cmd()
    proc = procs.start(name, [*(wrapper or ()), *cmd, "serve", "--config", str(cfg), "--host", HOST,
                              "--port", str(port)], env=env, cpus=pin.proxies, cwd=src or ROOT)
    return Started(name, port, proc, [proc.pid])


def export_revision(rev: str, dest: Path) -> Path:
    """``gateway/`` as of git revision ``rev``, written under ``dest`` (which is returned)."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "archive", rev, "gateway"], cwd=ROOT, capture_output=True, timeout=60,
                             check=False)
    if archive.returncode != 0:
        raise SystemExit(f"--baseline {rev}: git archive failed: {archive.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True, timeout=60)
    return dest


async def metric_value(port: int, name: str) -> float | None:
    """One unlabelled sample from the gateway's /metrics (None when absent or unreadable)."""
    try:
        conn = await HttpConn.open(port)
        try:
            async with asyncio.timeout(10):
                status, body = await conn.exchange(http_request("GET", "/metrics", port, None))
        finally:
            conn.close()
    except (OSError, TimeoutError, httptools.HttpParserError):
        return None
    for line in body.decode(errors="replace").splitlines():
        if line.startswith(name + " ") and status == 200:
            return float(line.split()[1])
    return None


def _ping_redis(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


async def start_redis(procs: Procs, pin: Pinning, tmp: Path) -> Started:
    """A redis-server of our own (no persistence) on a free port, for the Redis-limits gateway.

    Pinned with the stub and the load generator: its CPU is the round trip's, not the gateway's."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server not found (`make system-deps` installs it)")
    port = free_port()
    proc = procs.start("redis", [binary, "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no",
                                 "--dir", str(tmp)], cpus=pin.load)
    deadline = perf() + 15
    while not _ping_redis(port):
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with {proc.returncode}:\n{procs.log_tail('redis')}")
        if perf() > deadline:
            raise RuntimeError("redis-server not ready after 15 s")
        await asyncio.sleep(0.05)
    return Started("redis", port, proc, [proc.pid])


def start_floor(procs: Procs, pin: Pinning, stub_port: int, wrapper: list[str] | None = None) -> Started:
    port = free_port()
    proc = procs.start("floor", [*(wrapper or ()), sys.executable, str(FLOOR_SCRIPT), "--port", str(port), "--upstream",
                                 f"http://{HOST}:{stub_port}", "--upstream-key", STUB_KEY, "--client-key",
                                 CLIENT_KEY, "--model", f"{PUBLIC_MODEL}={SERVED_MODEL}"], cpus=pin.proxies)
    return Started("floor", port, proc, [proc.pid])


def find_nginx(install: bool) -> tuple[str | None, str]:
    """The nginx binary, installing nginx-light when allowed; else None and why."""
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if found or not install:
        return found, "" if found else "nginx is not installed (--no-install-nginx)"
    print("nginx not found: installing Debian's nginx-light (scripts/install_nginx.sh) ...", flush=True)
    done = subprocess.run(["bash", str(INSTALL_NGINX)], capture_output=True, text=True, timeout=600, check=False)
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    return found, "" if found else (done.stderr.strip() or "nginx-light could not be installed")


NGINX_CONF = """worker_processes 1;
daemon off;
master_process on;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/body;
  proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fastcgi;
  uwsgi_temp_path {tmp}/uwsgi;
  scgi_temp_path {tmp}/scgi;
  upstream stub {{ server {host}:{stub_port}; keepalive 256; }}
  server {{
    listen {host}:{port};
    location / {{
      proxy_pass http://stub;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
"""


def start_nginx(procs: Procs, pin: Pinning, binary: str, stub_port: int, tmp: Path) -> Started:
    port = free_port()
    conf = tmp / "nginx.conf"
    conf.write_text(NGINX_CONF.format(tmp=tmp, host=HOST, port=port, stub_port=stub_port))
    proc = procs.start("nginx", [binary, "-p", str(tmp), "-c", str(conf)], cpus=pin.proxies)
    return Started("nginx", port, proc, [proc.pid])


def child_pids(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def ready_requests(name: str, port: int) -> list[bytes]:
    from loadtest.bench.scenarios import Target, make_scenario

    if name == "stub":
        return [http_request("GET", "/health", port, None), http_request("GET", "/v1/models", port, STUB_KEY)]
    key, model = (STUB_KEY, SERVED_MODEL) if name == "nginx" else (CLIENT_KEY, PUBLIC_MODEL)
    target = Target(name, port, key, model, model)
    chat = make_scenario("chat", target, 4, 0).request  # the mapping works end to end
    return [chat] if name == "nginx" else [http_request("GET", "/health", port, None), chat]
