"""The load generator: one HTTP/1.1 keep-alive connection per worker on asyncio, parsed with httptools.

Request bytes are built once (`scenarios.make_scenario`), connections are opened before the clock
starts, and every response is checked. It costs a small fraction of the servers' CPU per request
(reported as `client`), so it does not decide the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httptools

from loadtest.bench.scenarios import Scenario, Target, check_response, make_scenario

HOST = "127.0.0.1"
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
perf = time.perf_counter


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


def cpu_seconds(pids: Sequence[int]) -> float | None:
    """user+system CPU time of processes (Linux /proc), or None when one cannot be read."""
    total = 0.0
    for pid in pids:
        one = _cpu_one(pid)
        if one is None:
            return None
        total += one
    return total


def _cpu_one(pid: int) -> float | None:
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


async def run_load(sc: Scenario, port: int, requests: int, concurrency: int, pids: dict[str, Sequence[int]],
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

    cpu0 = {name: cpu_seconds(p) for name, p in pids.items()}
    client0 = time.process_time()
    t0 = perf()
    await asyncio.gather(*(worker(c) for c in conns))
    raw.elapsed = perf() - t0
    raw.cpu["client"] = time.process_time() - client0
    for name, p in pids.items():
        before, after = cpu0[name], cpu_seconds(p)
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
