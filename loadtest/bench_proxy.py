"""Gateway overhead benchmark: the same load against the upstream directly and through the gateway.

Starts ``loadtest/upstream_stub.py`` (a fast vLLM-like backend) and ``gateway serve`` in front of it,
both on 127.0.0.1, waits until both answer (polling, no fixed sleeps), then for each scenario and
concurrency runs the same bounded load against (a) the stub directly and (b) the gateway,
alternating the two in rounds so machine noise hits both alike:

- ``chat``: non-streaming ``POST /v1/chat/completions``;
- ``stream``: streaming chat with ``--stream-tokens`` tokens (time to first byte and full stream);
- ``models``: ``GET /v1/models`` (served by the gateway itself: its bare per-request cost).

Every response is checked (status, complete body, the public model name in every gateway chunk),
and before the load a slow stream (a pause between tokens) checks that the gateway relays
incrementally. Results: a table on stdout and ``var/bench/results-<timestamp>.json``.
``--profile`` adds a py-spy profile of the gateway under non-streaming load.

The load generator is a small HTTP/1.1 client on asyncio (uvloop + httptools: the parser uvicorn
uses), one keep-alive connection per concurrent worker, so that it costs less CPU than the servers
it measures; its own CPU per request is reported next to theirs.

    .venv/bin/python loadtest/bench_proxy.py --quick
    .venv/bin/python loadtest/bench_proxy.py --requests 3000 --concurrency 16 64 --profile
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import datetime as dt
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import httptools

ROOT = Path(__file__).resolve().parent.parent
STUB_SCRIPT = ROOT / "loadtest" / "upstream_stub.py"
RESULTS_DIR = ROOT / "var" / "bench"

PUBLIC_MODEL = "bench-model"
SERVED_MODEL = "tiny"
STUB_KEY = "sk-stub-bench-0123456789"
CLIENT_KEY = "sk-bench-client-0123456789"
HOST = "127.0.0.1"
SCENARIOS = ("chat", "stream", "models")
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

perf = time.perf_counter


# ----------------------------------------------------------------------------------------------
# Load generator: one HTTP/1.1 keep-alive connection per worker, parsed with httptools.
# ----------------------------------------------------------------------------------------------
class HttpConn(asyncio.Protocol):
    """One client connection; ``exchange`` sends a prepared request and waits for the whole response."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.parts: list[bytes] = []
        self.first = 0.0  # perf_counter() at the first body bytes
        self.done = 0.0
        self.times: list[float] | None = None  # arrival time of every body piece, when asked for
        self.content_type = b""
        self.usable = False

    @classmethod
    async def open(cls, port: int) -> HttpConn:
        loop = asyncio.get_running_loop()
        _transport, conn = await loop.create_connection(cls, HOST, port)
        return conn

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.usable = True

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.usable = False
        self._fail(exc or ConnectionResetError("the server closed the connection"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-type":
            self.content_type = value

    def on_body(self, body: bytes) -> None:
        now = perf()
        if not self.parts:
            self.first = now
        self.parts.append(body)
        if self.times is not None:
            self.times.append(now)

    def on_message_complete(self) -> None:
        self.done = perf()
        if not self.parser.should_keep_alive():
            self.usable = False
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        self.usable = False
        w = self.waiter
        if w is not None and not w.done():
            w.set_exception(exc)
        if self.transport is not None:
            self.transport.close()

    async def exchange(self, request: bytes, record_times: bool = False) -> tuple[int, bytes]:
        assert self.transport is not None and self.usable
        self.parts = []
        self.first = 0.0
        self.content_type = b""
        self.times = [] if record_times else None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        try:
            await self.waiter
        finally:
            self.waiter = None
        return self.parser.get_status_code(), b"".join(self.parts)

    def close(self) -> None:
        self.usable = False
        if self.transport is not None:
            self.transport.close()


def http_request(method: str, path: str, port: int, key: str | None, body: bytes | None = None,
                 extra: Sequence[tuple[str, str]] = ()) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {HOST}:{port}", "User-Agent: bench-proxy"]
    if key is not None:
        lines.append(f"Authorization: Bearer {key}")
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


# ----------------------------------------------------------------------------------------------
# Targets, scenarios and response checks
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    name: str  # "direct" or "gateway"
    port: int
    key: str
    model: str  # the model name this target expects and answers with


@dataclass(frozen=True)
class Scenario:
    name: str
    request: bytes
    stream: bool
    marker: bytes  # must be in the body (once per JSON event when streaming)
    forbidden: bytes | None  # must not be in the body (the served name, through the gateway)
    events: int  # SSE events expected, [DONE] included (0: not a stream)


def _chat_body(model: str, stream: bool, tokens: int) -> bytes:
    body: dict[str, Any] = {
        "model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": tokens,
        "temperature": 0,
    }
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body, separators=(",", ":")).encode()


def make_scenario(name: str, t: Target, tokens: int, delay_ms: float) -> Scenario:
    marker = b'"model":' + json.dumps(t.model).encode()
    forbidden = b'"model":' + json.dumps(SERVED_MODEL).encode() if t.model != SERVED_MODEL else None
    if name == "chat":
        req = http_request("POST", "/v1/chat/completions", t.port, t.key, _chat_body(t.model, False, 16))
        return Scenario(name, req, False, marker, forbidden, 0)
    if name == "stream":
        extra = [("x-stub-token-delay-ms", f"{delay_ms:g}")]
        req = http_request("POST", "/v1/chat/completions", t.port, t.key, _chat_body(t.model, True, tokens), extra)
        # role delta + one event per token + usage chunk + [DONE]
        return Scenario(name, req, True, marker, forbidden, tokens + 3)
    if name == "models":
        # The gateway lists public IDs ("id":"bench-model"), the stub its served name.
        req = http_request("GET", "/v1/models", t.port, t.key)
        return Scenario(name, req, False, b'"id":' + json.dumps(t.model).encode(), None, 0)
    raise ValueError(f"unknown scenario {name!r}")


def check_response(sc: Scenario, status: int, body: bytes) -> str | None:
    """Why this response is wrong, or None."""
    if status != 200:
        return f"status {status}: {body[:200]!r}"
    if not sc.stream:
        if sc.marker not in body:
            return f"{sc.marker.decode()} missing from the body: {body[:200]!r}"
        return None
    if not body.endswith(b"data: [DONE]\n\n"):
        return f"the stream does not end with data: [DONE]: {body[-200:]!r}"
    events = body.count(b"data: ")
    if events != sc.events:
        return f"{events} SSE events, expected {sc.events}"
    if body.count(sc.marker) != sc.events - 1:
        return f"{body.count(sc.marker)} of {sc.events - 1} chunks carry {sc.marker.decode()}"
    if sc.forbidden is not None and sc.forbidden in body:
        return f"a chunk still carries the served name {sc.forbidden.decode()}"
    return None


# ----------------------------------------------------------------------------------------------
# Running a load
# ----------------------------------------------------------------------------------------------
def cpu_seconds(pid: int | None) -> float | None:
    """user+system CPU time of a process (Linux /proc), or None."""
    if pid is None:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def upstream_connections(pid: int, port: int) -> int | None:
    """Established TCP connections from process ``pid`` to 127.0.0.1:``port`` (Linux /proc), or None."""
    try:
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return None
    want = f":{port:04X}"
    n = 0
    for line in lines:
        f = line.split()
        # f[2]: remote address:port (hex), f[3]: state (01 = ESTABLISHED), f[9]: inode
        if len(f) > 9 and f[2].endswith(want) and f[3] == "01" and f[9] in inodes:
            n += 1
    return n


@dataclass
class Raw:
    """Measurements of one or more runs of the same cell against the same target."""

    latencies: list[float] = field(default_factory=list)
    ttfbs: list[float] = field(default_factory=list)
    ok: int = 0
    errors: int = 0
    elapsed: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)  # process -> CPU seconds
    first_error: str | None = None

    def merge(self, other: Raw) -> None:
        self.latencies += other.latencies
        self.ttfbs += other.ttfbs
        self.ok += other.ok
        self.errors += other.errors
        self.elapsed += other.elapsed
        for k, v in other.cpu.items():
            self.cpu[k] = self.cpu.get(k, 0.0) + v
        self.first_error = self.first_error or other.first_error


async def run_load(sc: Scenario, port: int, requests: int, concurrency: int, pids: dict[str, int],
                   timeout_s: float, stop_at: float | None = None) -> Raw:
    """``requests`` requests (or until ``stop_at``) from ``concurrency`` workers on their own connections."""
    raw = Raw()
    remaining = requests
    conns = [await HttpConn.open(port) for _ in range(concurrency)]

    async def worker(conn: HttpConn | None) -> None:
        nonlocal remaining
        while remaining > 0 and (stop_at is None or perf() < stop_at):
            remaining -= 1
            try:
                if conn is None or not conn.usable:
                    conn = await HttpConn.open(port)
                started = perf()
                async with asyncio.timeout(timeout_s):
                    status, body = await conn.exchange(sc.request)
            except (OSError, TimeoutError, httptools.HttpParserError) as exc:
                raw.errors += 1
                raw.first_error = raw.first_error or f"{type(exc).__name__}: {exc}"
                if conn is not None:
                    conn.close()
                conn = None
                continue
            problem = check_response(sc, status, body)
            if problem is not None:
                raw.errors += 1
                raw.first_error = raw.first_error or problem
                continue
            raw.ok += 1
            raw.latencies.append(conn.done - started)
            if sc.stream:
                raw.ttfbs.append(conn.first - started)
        if conn is not None:
            conn.close()

    cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
    client0 = time.process_time()
    t0 = perf()
    await asyncio.gather(*(worker(c) for c in conns))
    raw.elapsed = perf() - t0
    raw.cpu["client"] = time.process_time() - client0
    for name, pid in pids.items():
        before, after = cpu0[name], cpu_seconds(pid)
        if before is not None and after is not None:
            raw.cpu[name] = after - before
    return raw


def pct(xs: list[float], q: float) -> float:
    """Percentile (linear interpolation) of an already sorted list, in ms."""
    if not xs:
        return float("nan")
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return (xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)) * 1000.0


@dataclass
class RunResult:
    scenario: str
    target: str
    concurrency: int
    requests: int
    errors: int
    elapsed_s: float
    rps: float
    latency_ms: dict[str, float]
    ttfb_ms: dict[str, float] | None
    cpu_ms_per_req: dict[str, float]
    first_error: str | None
    upstream_conns: int | None = None  # gateway -> stub connections held after the run

    @classmethod
    def of(cls, scenario: str, target: str, concurrency: int, raw: Raw) -> RunResult:
        lat = sorted(raw.latencies)
        ttfb = sorted(raw.ttfbs)
        n = raw.ok + raw.errors
        return cls(
            scenario, target, concurrency, n, raw.errors, round(raw.elapsed, 3),
            round(raw.ok / raw.elapsed, 1) if raw.elapsed > 0 else 0.0,
            {"p50": pct(lat, 0.5), "p95": pct(lat, 0.95), "p99": pct(lat, 0.99),
             "mean": sum(lat) / len(lat) * 1000.0 if lat else float("nan"), "max": pct(lat, 1.0)},
            {"p50": pct(ttfb, 0.5), "p95": pct(ttfb, 0.95), "p99": pct(ttfb, 0.99)} if ttfb else None,
            {k: v * 1000.0 / n for k, v in raw.cpu.items()} if n else {},
            raw.first_error,
        )


# ----------------------------------------------------------------------------------------------
# Incremental streaming check
# ----------------------------------------------------------------------------------------------
async def verify_stream(t: Target, tokens: int, delay_ms: float, timeout_s: float) -> dict[str, Any]:
    """One slow stream: events must arrive spread over the generation, not all at the end."""
    sc = make_scenario("stream", t, tokens, delay_ms)
    conn = await HttpConn.open(t.port)
    try:
        started = perf()
        async with asyncio.timeout(timeout_s):
            status, body = await conn.exchange(sc.request, record_times=True)
        times = conn.times or []
        ctype = conn.content_type.decode("latin-1")
    finally:
        conn.close()
    problem = check_response(sc, status, body)
    first = (times[0] - started) * 1000.0 if times else float("nan")
    last = (times[-1] - started) * 1000.0 if times else float("nan")
    generation = (tokens - 1) * delay_ms  # time between the first and the last token, upstream side
    if problem is None and not ctype.startswith("text/event-stream"):
        problem = f"content-type {ctype!r}"
    if problem is None and len(times) < tokens // 2:
        problem = f"the body came in {len(times)} pieces for {tokens} tokens (buffered?)"
    if problem is None and last - first < 0.5 * generation:
        problem = f"events spread over {last - first:.0f} ms for a {generation:.0f} ms generation (buffered?)"
    return {"target": t.name, "tokens": tokens, "token_delay_ms": delay_ms, "pieces": len(times),
            "first_piece_ms": round(first, 2), "last_piece_ms": round(last, 2),
            "content_type": ctype, "ok": problem is None, "problem": problem}


# ----------------------------------------------------------------------------------------------
# Processes
# ----------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def _die_with_parent() -> None:
    """In the child (Linux): get SIGTERM when the benchmark dies, even by SIGKILL."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Procs:
    """Child processes, stopped (TERM, then KILL) in reverse order by ``stop_all``."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = (self.logdir / f"{name}.log").open("wb")
        try:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
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


def gateway_config(stub_port: int) -> dict[str, Any]:
    return {
        "models": [{
            "id": PUBLIC_MODEL,
            "upstreams": [{"name": "stub", "url": f"http://{HOST}:{stub_port}", "model": SERVED_MODEL,
                           "api_key": STUB_KEY}],
        }],
        "keys": [{"name": "bench", "key": CLIENT_KEY}],
        "health": {"interval_s": 30},
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


# ----------------------------------------------------------------------------------------------
# Profiling with py-spy
# ----------------------------------------------------------------------------------------------
def find_py_spy() -> str | None:
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


def summarize_profile(path: Path, top: int = 15) -> dict[str, Any]:
    """Top costs from py-spy's raw (collapsed stacks) output; each sample is one frame stack.

    - ``gateway_self``: each sample charged to its innermost gateway frame, so the library work a
      gateway function asks for is billed to that function;
    - ``gateway_calls``: the same, split by the library function the gateway frame called;
    - ``library_inclusive``: frames below the innermost gateway frame (what those calls cost inside
      httpx, uvicorn, ...), counted once per sample;
    - ``gateway_inclusive``: gateway frames anywhere on the stack;
    - ``self``: the innermost frame of any code.
    """
    total = 0
    own: dict[str, int] = {}
    gw_self: dict[str, int] = {}
    gw_calls: dict[str, int] = {}
    lib_incl: dict[str, int] = {}
    gw_incl: dict[str, int] = {}
    # Shorter names: gateway/..., httpx/..., <stdlib>/asyncio/...
    prefixes = [(sysconfig.get_paths()["purelib"] + "/", ""), (sysconfig.get_paths()["stdlib"] + "/", "<stdlib>/"),
                (str(ROOT) + "/", "")]

    def short(frame: str) -> str:
        for old, new in prefixes:
            frame = frame.replace(old, new)
        return frame

    def add(d: dict[str, int], k: str, n: int) -> None:
        d[k] = d.get(k, 0) + n

    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        count = int(count_s)
        total += count
        frames = [short(f) for f in stack.split(";")]
        frames = [f for f in frames if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        add(own, frames[-1], count)
        gw_at = [i for i, f in enumerate(frames) if "(gateway/" in f]
        for f in dict.fromkeys(frames[i] for i in gw_at):
            add(gw_incl, f, count)
        if not gw_at:
            continue
        inner = gw_at[-1]
        add(gw_self, frames[inner], count)
        callee = frames[inner + 1] if inner + 1 < len(frames) else "(own code)"
        add(gw_calls, f"{frames[inner]} -> {callee}", count)
        for f in dict.fromkeys(frames[inner + 1:]):
            add(lib_incl, f, count)

    def ranked(d: dict[str, int], n: int = top) -> list[dict[str, Any]]:
        items = sorted(d.items(), key=lambda kv: -kv[1])[:n]
        return [{"frame": k, "samples": v, "pct": round(100.0 * v / total, 1) if total else 0.0} for k, v in items]

    return {"samples": total, "gateway_self": ranked(gw_self), "gateway_calls": ranked(gw_calls),
            "library_inclusive": ranked(lib_incl, 2 * top), "gateway_inclusive": ranked(gw_incl),
            "self": ranked(own)}


async def profile_gateway(py_spy: str, gw_pid: int, sc: Scenario, port: int, concurrency: int, seconds: float,
                          out: Path, timeout_s: float) -> tuple[Raw, dict[str, Any]]:
    cmd = [py_spy, "record", "--pid", str(gw_pid), "--rate", "100", "--format", "raw", "--function",
           "--full-filenames", "--output", str(out)]
    # py-spy reports on stdout; stderr is merged so that neither pipe can fill up.
    spy = await asyncio.create_subprocess_exec(*cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert spy.stdout is not None
    said = b""
    try:
        async with asyncio.timeout(30):  # until py-spy says it is sampling
            while b"Sampling" not in (line := await spy.stdout.readline()):
                said += line
                if not line:
                    raise RuntimeError(f"py-spy exited with {await spy.wait()}: {said.decode(errors='replace')}")
        raw = await run_load(sc, port, 10**9, concurrency, {"gateway": gw_pid}, timeout_s,
                             stop_at=perf() + seconds)
        spy.send_signal(signal.SIGINT)
        async with asyncio.timeout(30):
            said += await spy.stdout.read()
            await spy.wait()
    finally:
        if spy.returncode is None:
            spy.kill()
            await spy.wait()
    try:
        return raw, summarize_profile(out)
    except OSError:
        raise RuntimeError(f"py-spy wrote no profile: {said.decode(errors='replace')[-500:]}") from None


# ----------------------------------------------------------------------------------------------
# The benchmark
# ----------------------------------------------------------------------------------------------
@dataclass
class Options:
    requests: int
    concurrency: list[int]
    stream_tokens: int
    token_delay_ms: float
    rounds: int
    scenarios: list[str]
    timeout_s: float
    verify_tokens: int
    verify_delay_ms: float
    profile: bool
    profile_seconds: float
    profile_scenario: str
    redis_url: str | None
    quick: bool
    write_json: bool


def summary_of(direct: RunResult, gw: RunResult) -> dict[str, Any]:
    s: dict[str, Any] = {
        "scenario": direct.scenario, "concurrency": direct.concurrency,
        "overhead_p50_ms": round(gw.latency_ms["p50"] - direct.latency_ms["p50"], 3),
        "overhead_p95_ms": round(gw.latency_ms["p95"] - direct.latency_ms["p95"], 3),
        "throughput_ratio": round(gw.rps / direct.rps, 3) if direct.rps else None,
        "gateway_cpu_ms_per_req": round(gw.cpu_ms_per_req.get("gateway", float("nan")), 3),
        "gateway_upstream_conns": gw.upstream_conns,
    }
    if direct.ttfb_ms and gw.ttfb_ms:
        s["ttfb_overhead_p50_ms"] = round(gw.ttfb_ms["p50"] - direct.ttfb_ms["p50"], 3)
    return s


async def bench(opts: Options, procs: Procs, stub: subprocess.Popen[bytes], stub_port: int,
                gw: subprocess.Popen[bytes], gw_port: int, stamp: str) -> dict[str, Any]:
    direct = Target("direct", stub_port, STUB_KEY, SERVED_MODEL)
    gateway = Target("gateway", gw_port, CLIENT_KEY, PUBLIC_MODEL)
    pids = {"stub": stub.pid, "gateway": gw.pid}
    out: dict[str, Any] = {}

    stub_ready = await wait_ready("stub", stub, stub_port, [
        http_request("GET", "/health", stub_port, None),
        http_request("GET", "/v1/models", stub_port, STUB_KEY),
    ], procs)
    gw_ready = await wait_ready("gateway", gw, gw_port, [
        http_request("GET", "/health", gw_port, None),
        make_scenario("chat", gateway, 4, 0).request,  # the model mapping works end to end
    ], procs)
    out["startup_s"] = {"stub": round(stub_ready, 3), "gateway": round(gw_ready, 3)}
    print(f"ready: stub :{stub_port} ({stub_ready:.2f}s), gateway :{gw_port} ({gw_ready:.2f}s)", flush=True)

    verify = [await verify_stream(t, opts.verify_tokens, opts.verify_delay_ms, opts.timeout_s)
              for t in (direct, gateway)]
    out["stream_check"] = verify
    for v in verify:
        state = "ok" if v["ok"] else f"FAILED: {v['problem']}"
        print(f"incremental stream via {v['target']}: {v['pieces']} pieces, first {v['first_piece_ms']:.1f} ms, "
              f"last {v['last_piece_ms']:.1f} ms ({v['tokens']} tokens x {v['token_delay_ms']:g} ms): {state}",
              flush=True)

    runs: list[RunResult] = []
    summary: list[dict[str, Any]] = []
    per_round = max(1, opts.requests // opts.rounds)
    for name in opts.scenarios:
        scs = {t.name: make_scenario(name, t, opts.stream_tokens, opts.token_delay_ms) for t in (direct, gateway)}
        for conc in opts.concurrency:
            warm = max(2 * conc, 50)
            for t in (direct, gateway):
                await run_load(scs[t.name], t.port, warm, conc, {}, opts.timeout_s)
            acc = {"direct": Raw(), "gateway": Raw()}
            for _ in range(opts.rounds):  # alternate so that noise hits both targets alike
                for t in (direct, gateway):
                    acc[t.name].merge(await run_load(scs[t.name], t.port, per_round, conc, pids, opts.timeout_s))
            d = RunResult.of(name, "direct", conc, acc["direct"])
            g = RunResult.of(name, "gateway", conc, acc["gateway"])
            g.upstream_conns = upstream_connections(gw.pid, stub_port)
            runs += [d, g]
            summary.append(summary_of(d, g))
            print_rows([d, g], summary[-1])
    out["runs"] = [asdict(r) for r in runs]
    out["summary"] = summary

    if opts.profile:
        py_spy = find_py_spy()
        if py_spy is None:
            print("--profile: py-spy not found; install it with `.venv/bin/pip install py-spy`", flush=True)
            out["profile"] = {"error": "py-spy not found"}
        else:
            conc = max(opts.concurrency)
            path = RESULTS_DIR / f"profile-{stamp}.txt"
            name = opts.profile_scenario
            print(f"profiling the gateway (py-spy, {opts.profile_seconds:g}s of {name} load at "
                  f"concurrency {conc}) ...", flush=True)
            sc = make_scenario(name, gateway, opts.stream_tokens, opts.token_delay_ms)
            try:
                raw, prof = await profile_gateway(py_spy, gw.pid, sc, gw_port, conc, opts.profile_seconds, path,
                                                  opts.timeout_s)
            except (RuntimeError, OSError, TimeoutError) as exc:
                print(f"profiling failed: {type(exc).__name__}: {exc}", flush=True)
                out["profile"] = {"error": f"{type(exc).__name__}: {exc}"}
            else:
                r = RunResult.of(name, "gateway+py-spy", conc, raw)
                out["profile"] = {"file": str(path.relative_to(ROOT)), "run": asdict(r), **prof}
                print_profile(out["profile"])
    return out


# ----------------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------------
HEADER = (f"{'scenario':<8} {'conc':>4} {'target':<8} {'req/s':>8} {'p50':>7} {'p95':>7} {'p99':>7} "
          f"{'ttfb50':>7} {'ttfb95':>7} {'err':>4}  cpu ms/req client/stub/gw")


def _f(x: float | None, w: int = 7, d: int = 2) -> str:
    return f"{'-':>{w}}" if x is None or x != x else f"{x:>{w}.{d}f}"


def print_rows(rows: list[RunResult], s: dict[str, Any]) -> None:
    for r in rows:
        cpu = "/".join(_f(r.cpu_ms_per_req.get(k), 0, 3) for k in ("client", "stub", "gateway"))
        if r.target == "direct":
            cpu = cpu.rsplit("/", 1)[0] + "/-"
        print(f"{r.scenario:<8} {r.concurrency:>4} {r.target:<8} {r.rps:>8.1f} {_f(r.latency_ms['p50'])} "
              f"{_f(r.latency_ms['p95'])} {_f(r.latency_ms['p99'])} "
              f"{_f(r.ttfb_ms['p50'] if r.ttfb_ms else None)} {_f(r.ttfb_ms['p95'] if r.ttfb_ms else None)} "
              f"{r.errors:>4}  {cpu}", flush=True)
        if r.first_error:
            print(f"    first error: {r.first_error}", flush=True)
    extra = f", TTFB p50 {s['ttfb_overhead_p50_ms']:+.2f} ms" if "ttfb_overhead_p50_ms" in s else ""
    conns = s.get("gateway_upstream_conns")
    pool = f" (gateway holds {conns} upstream connections)" if conns is not None else ""
    print(f"{'':<14}=> gateway overhead p50 {s['overhead_p50_ms']:+.2f} ms, p95 {s['overhead_p95_ms']:+.2f} ms"
          f"{extra}; throughput ratio gateway/direct {s['throughput_ratio']}{pool}", flush=True)


def print_profile(p: dict[str, Any]) -> None:
    r = p["run"]
    print(f"\nprofile: {p['samples']} samples -> {p['file']} ({r['scenario']} load under py-spy: {r['rps']} req/s, "
          f"p50 {r['latency_ms']['p50']:.2f} ms, gateway CPU {r['cpu_ms_per_req'].get('gateway', 0):.3f} ms/req)")
    for key, title, n in (
        ("gateway_self", "cost charged to the innermost gateway frame (incl. the library calls it makes)", 12),
        ("gateway_calls", "... split by the library function it called", 12),
        ("library_inclusive", "library frames below the innermost gateway frame, inclusive", 20),
        ("self", "innermost frame (any code)", 12),
    ):
        print(f"  {title}:")
        for row in p[key][:n]:
            print(f"    {row['pct']:5.1f}%  {row['frame']}")


def _finite(x: Any) -> Any:
    """NaN (no samples) as null, so that the file is strict JSON."""
    if isinstance(x, float) and x != x:
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


def machine_info() -> dict[str, Any]:
    cpu = platform.processor()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"cpus": os.cpu_count(), "cpu": cpu, "platform": platform.platform(),
            "python": platform.python_version(), "loadavg_at_start": load}


def git_rev() -> str | None:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10, check=False).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "gateway"], cwd=ROOT, capture_output=True,
                               text=True, timeout=10, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{rev}{'+dirty' if dirty else ''}" if rev else None


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------
def _ints(values: Sequence[str]) -> list[int]:
    out = [int(p) for v in values for p in v.split(",") if p.strip()]
    if not out or any(c < 1 for c in out):
        raise argparse.ArgumentTypeError("concurrency values must be positive integers")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Gateway overhead vs. a direct connection to a vLLM-like stub.")
    p.add_argument("--requests", type=int, help="requests per scenario, concurrency and target (default 3000; "
                                                 "quick: 1000)")
    p.add_argument("--concurrency", nargs="+", help="concurrency levels, e.g. 16 64 or 16,64 (default 16 64; "
                                                     "quick: 16)")
    p.add_argument("--stream-tokens", type=int, help="tokens per streamed completion (default 32; quick: 16)")
    p.add_argument("--token-delay-ms", type=float, default=0.0, help="stub pause between streamed tokens "
                                                                     "during the load (default 0)")
    p.add_argument("--rounds", type=int, help="alternating direct/gateway rounds per cell (default 2; quick: 1)")
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma list of {', '.join(SCENARIOS)}")
    p.add_argument("--timeout", type=float, default=30.0, help="per-request timeout in seconds")
    p.add_argument("--profile", action="store_true", help="profile the gateway with py-spy under chat load")
    p.add_argument("--profile-seconds", type=float, default=15.0, help="length of the profiled load (quick: 5)")
    p.add_argument("--profile-scenario", choices=("chat", "stream"), default="chat",
                   help="the load to profile under (default: non-streaming chat)")
    p.add_argument("--redis-url", help="GATEWAY_REDIS_URL for the gateway (default: none)")
    p.add_argument("--quick", action="store_true", help="a short run (< 30 s): 1000 requests, concurrency 16")
    p.add_argument("--no-json", action="store_true", help="do not write var/bench/results-*.json")
    return p


def options_from(args: argparse.Namespace) -> Options:
    q = args.quick
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown or not scenarios:
        raise SystemExit(f"unknown scenarios {unknown}; choose from {', '.join(SCENARIOS)}")
    opts = Options(
        requests=args.requests or (1000 if q else 3000),
        concurrency=_ints(args.concurrency) if args.concurrency else ([16] if q else [16, 64]),
        stream_tokens=args.stream_tokens or (16 if q else 32),
        token_delay_ms=args.token_delay_ms,
        rounds=args.rounds or (1 if q else 2),
        scenarios=scenarios,
        timeout_s=args.timeout,
        verify_tokens=8,
        verify_delay_ms=10.0 if q else 20.0,
        profile=args.profile,
        profile_seconds=min(args.profile_seconds, 5.0) if q else args.profile_seconds,
        profile_scenario=args.profile_scenario,
        redis_url=args.redis_url,
        quick=q,
        write_json=not args.no_json,
    )
    if opts.requests < 1 or opts.stream_tokens < 1 or opts.rounds < 1:
        raise SystemExit("--requests, --stream-tokens and --rounds must be positive")
    return opts


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    def handler(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _runner() -> asyncio.Runner:
    try:
        import uvloop
    except ImportError:
        return asyncio.Runner()
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)


def main(argv: Sequence[str] | None = None) -> int:
    opts = options_from(build_parser().parse_args(argv))
    started = dt.datetime.now(dt.UTC)
    stamp = started.strftime("%Y%m%d-%H%M%S")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    print(f"bench_proxy {started:%Y-%m-%d %H:%M:%S}Z: {os.cpu_count()} CPUs, requests {opts.requests}, "
          f"concurrency {opts.concurrency}, stream tokens {opts.stream_tokens}, token delay "
          f"{opts.token_delay_ms:g} ms, rounds {opts.rounds}", flush=True)

    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as tmp, sigterm_as_interrupt():
        procs = Procs(Path(tmp))
        try:
            stub_port, gw_port = free_port(), free_port()
            while gw_port == stub_port:
                gw_port = free_port()
            cfg = Path(tmp) / "gateway.yaml"
            cfg.write_text(json.dumps(gateway_config(stub_port), indent=2))  # JSON is YAML
            stub = procs.start("stub", [sys.executable, str(STUB_SCRIPT), "--port", str(stub_port),
                                        "--api-key", STUB_KEY, "--served-name", SERVED_MODEL])
            gw = procs.start("gateway", [*gateway_cmd(), "serve", "--config", str(cfg), "--host", HOST,
                                         "--port", str(gw_port)], env=gateway_env(opts.redis_url))
            with _runner() as runner:
                result = runner.run(bench(opts, procs, stub, stub_port, gw, gw_port, stamp))
            gw_log = procs.log_tail("gateway", 20)
        except KeyboardInterrupt:
            print("\ninterrupted; stopping the stub and the gateway", file=sys.stderr)
            return 130
        except (RuntimeError, OSError) as exc:
            print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
            if not isinstance(exc, RuntimeError):  # e.g. a server went away during the load
                print(f"gateway log:\n{procs.log_tail('gateway')}\nstub log:\n{procs.log_tail('stub')}",
                      file=sys.stderr)
            return 1
        finally:
            procs.stop_all()

    if gw_log.strip():
        print(f"\ngateway log (warnings and errors, last lines):\n{gw_log}")
    doc = {"started": started.isoformat(), "machine": machine_info(), "gateway_rev": git_rev(),
           "options": asdict(opts), **result}
    if opts.write_json:
        path = RESULTS_DIR / f"results-{stamp}.json"
        path.write_text(json.dumps(_finite(doc), indent=2, default=str) + "\n")
        print(f"\nresults: {path.relative_to(ROOT)}")
    failed = [v for v in result["stream_check"] if not v["ok"]]
    errors = sum(r["errors"] for r in result["runs"])
    if failed or errors:
        print(f"FAILED: {len(failed)} stream checks, {errors} request errors", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
