"""Careless and hostile clients over real sockets against the real server (uvicorn + the gateway's
protocol, see gateway/http/): oversized heads, slowloris, slow and short bodies, idle connections,
connection floods, file-descriptor exhaustion, HTTP/1.0 streams, half-closed connections."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest
import yaml

from gateway.config import parse_config
from gateway.routing.health import HealthBoard, HealthMonitor
from gateway.routing.probe import ProbeResult, ProbeState, probe_upstream
from gateway.settings import Settings
from tests.fakes import FakeVLLM
from tests.integration.conftest import CLIENT_KEY, config_dict, upstream
from tests.support.gateway_server import GatewayServer
from tests.support.rawhttp import connect, post_json, read_to_close, read_until, split_response

LIMIT = 65536
CHAT = {"model": "public-chat", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}


@pytest.fixture
def gws(fake: FakeVLLM) -> Iterator[GatewayServer]:
    """A gateway with short timeouts (the defaults are 10 / 60 / 5 s) so tests stay quick."""
    config = parse_config(yaml.safe_dump(config_dict({"public-chat": [upstream(fake, name="fake0")]})), {})
    settings = Settings(access_log=False, header_timeout_s=1.5, body_timeout_s=1.5, idle_timeout_s=1.0)
    with GatewayServer(config, settings) as server:
        yield server


def _error(raw: bytes) -> tuple[int, dict[str, str], dict[str, object]]:
    status, headers, body = split_response(raw)
    assert headers["content-type"] == "application/json"
    err = orjson.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return status, headers, err


def _health_once(s: socket.socket) -> float:
    t0 = time.monotonic()
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    raw = read_until(s, lambda b: b"\r\n\r\n" in b and b.endswith(b"}"))
    assert raw.startswith(b"HTTP/1.1 200")
    return time.monotonic() - t0


class _LatencyProbe:
    """Another client's /health latency, measured on its own connection while a test attacks."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        s = connect(self.port, timeout=30)
        try:
            while not self._stop.is_set():
                self.samples.append(_health_once(s))
                time.sleep(0.02)  # well inside the idle timeout: the connection is kept alive
        finally:
            s.close()

    def __enter__(self) -> _LatencyProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


# -- head size ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("start", "status", "code"), [
    (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ", 431, "request_header_fields_too_large"),
    (b"GET /health HTTP/1.1\r\nHost: x\r\nX-", 431, "request_header_fields_too_large"),  # the name
    (b"GET /health?q=", 414, "uri_too_long"),
])
def test_oversized_head_is_answered_at_once(gws: GatewayServer, start: bytes, status: int, code: str) -> None:
    with connect(gws.port) as s:
        s.sendall(start + b"a" * (LIMIT + 16384))  # over the limit, and never finished
        t0 = time.monotonic()
        raw = read_to_close(s)  # the answer, then the server closes (on today's code: nothing, timeout)
    assert time.monotonic() - t0 < 5
    got, headers, err = _error(raw)
    assert (got, err["code"], err["type"]) == (status, code, "invalid_request_error")
    assert headers["connection"] == "close"


def test_huge_header_stream_is_cut_while_other_clients_stay_fast(gws: GatewayServer) -> None:
    """128 MiB of header value (today: buffered quadratically, /health waits seconds)."""
    sent = 0
    with _LatencyProbe(gws.port) as probe:
        while len(probe.samples) < 5:  # the baseline
            time.sleep(0.01)
        baseline = len(probe.samples)
        s = connect(gws.port, timeout=10)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Big: ")
        chunk = b"a" * (1 << 20)
        deadline = time.monotonic() + 20
        try:
            while sent < 128 << 20 and time.monotonic() < deadline:
                s.sendall(chunk)
                sent += len(chunk)
        except OSError:  # cut: reset or broken pipe
            pass
        s.close()
        time.sleep(0.3)  # a few more samples after the cut
    during = probe.samples[baseline:]
    assert sent < 128 << 20, "the server kept reading a 128 MiB header"
    assert during and max(during) < 1.0, f"/health latency during the attack: max {max(during):.3f}s"


def test_head_just_under_the_limit_and_large_bodies_still_pass(gws: GatewayServer, fake: FakeVLLM) -> None:
    with connect(gws.port) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (LIMIT - 200) + b"\r\n\r\n")
        assert read_until(s, lambda b: b.endswith(b"}")).startswith(b"HTTP/1.1 200")
    body = orjson.dumps({**CHAT, "user": "u" * 500_000})
    with post_json(gws.port, "/v1/chat/completions", body, CLIENT_KEY) as s:  # head + 500 KB at once
        raw = read_until(s, lambda b: b"\r\n\r\n" in b and b.rstrip().endswith(b"}"))
    assert raw.startswith(b"HTTP/1.1 200"), raw[:300]


def test_garbage_gets_an_openai_format_400(gws: GatewayServer) -> None:
    with connect(gws.port) as s:
        s.sendall(b"\x16\x03\x01\x02\x00 not http at all\r\n\r\n")
        status, _, err = _error(read_to_close(s))
    assert status == 400 and err["code"] == "invalid_http_request"


# -- timeouts -------------------------------------------------------------------------------------

def test_slowloris_head_is_cut_at_the_header_timeout(gws: GatewayServer) -> None:
    s = connect(gws.port, timeout=10)
    s.sendall(b"GET /health HTTP/1.1\r\n")
    t0 = time.monotonic()
    s.settimeout(0.4)
    raw = b""
    for i in range(40):  # one header line every 0.4 s: each arrives well inside any idle timeout
        try:
            s.sendall(b"X-Line-%d: a\r\n" % i)
        except OSError:
            break
        try:
            data = s.recv(65536)
        except TimeoutError:
            continue
        raw += data
        if not data or b"}" in raw:
            break
    elapsed = time.monotonic() - t0
    s.settimeout(5)
    raw += read_to_close(s)
    s.close()
    status, _, err = _error(raw)
    assert (status, err["code"]) == (408, "request_timeout")
    assert 1.2 < elapsed < 6, elapsed


@pytest.mark.parametrize("trickle", [True, False], ids=["slow-body", "short-body"])
def test_body_must_arrive_within_the_body_timeout(gws: GatewayServer, fake: FakeVLLM, trickle: bool) -> None:
    body = orjson.dumps(CHAT)
    s = connect(gws.port, timeout=10)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Authorization: Bearer " + CLIENT_KEY.encode() + b"\r\nContent-Length: "
              + str(len(body)).encode() + b"\r\n\r\n" + body[:10])
    t0 = time.monotonic()
    raw = b""
    if trickle:
        s.settimeout(0.3)
        for byte in body[10:]:
            try:
                s.sendall(bytes([byte]))
                raw += s.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if b"}" in raw:
                break
        s.settimeout(5)
    raw += read_to_close(s)
    s.close()
    elapsed = time.monotonic() - t0
    status, _, err = _error(raw)
    assert (status, err["code"]) == (408, "request_timeout")
    assert 1.2 < elapsed < 6, elapsed
    assert not fake.requests_to("/v1/chat/completions")  # nothing half-read went upstream


def test_idle_connections_are_closed(gws: GatewayServer) -> None:
    never = connect(gws.port, timeout=10)  # never sends a request
    kept = connect(gws.port, timeout=10)  # one request, then keep-alive silence
    _health_once(kept)
    t0 = time.monotonic()
    assert never.recv(1) == b"" and kept.recv(1) == b""
    assert time.monotonic() - t0 < 4  # idle timeout 1 s (uvicorn's keep-alive default is 5 s)
    never.close()
    kept.close()


# -- connection cap and file descriptors: `gateway serve` with a small open-file limit ------------

ServeLimited = Callable[..., tuple[int, "subprocess.Popen[bytes]"]]


@pytest.fixture
def serve_limited(tmp_path: Path, fake: FakeVLLM) -> Iterator[ServeLimited]:
    """`gateway serve` in a process whose open-file limit (soft and hard) is `nofile`."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(nofile: int, env: dict[str, str]) -> tuple[int, subprocess.Popen[bytes]]:
        path = tmp_path / "gateway.yaml"
        path.write_text(yaml.safe_dump(config_dict({"public-chat": [upstream(fake, name="fake0")]})))
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])

        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(path)],
            env={**os.environ, "GATEWAY_PORT": str(port), "GATEWAY_LOG_FORMAT": "json",
                 "GATEWAY_ACCESS_LOG": "false", **env},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=limit, start_new_session=True)
        procs.append(proc)
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
            with contextlib.suppress(OSError):
                s = _get(port, "/health")
                s.settimeout(2)
                if read_to_close_or_keep(s).startswith(b"HTTP/1.1 200"):
                    break
            assert time.monotonic() < deadline, "gateway serve did not start"
            time.sleep(0.05)
        return port, proc

    yield start
    for p in procs:
        if p.poll() is None:
            p.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(15)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)
        if p.stderr:
            p.stderr.close()


def read_to_close_or_keep(s: socket.socket) -> bytes:
    try:
        return read_until(s, lambda b: b.rstrip().endswith(b"}"))
    finally:
        s.close()


def _open_idle(port: int, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        socks.append(s)
    return socks


def test_idle_flood_does_not_starve_a_real_request(serve_limited: ServeLimited) -> None:
    """2,000 idle sockets against a process allowed 512 descriptors (today: every accept fails)."""
    port, proc = serve_limited(nofile=512, env={"GATEWAY_IDLE_TIMEOUT_S": "30"})
    flood = _open_idle(port, 2000)
    try:
        time.sleep(1.0)  # let the server accept (and push out) what it can
        for _ in range(3):
            with post_json(port, "/v1/chat/completions", orjson.dumps(CHAT), CLIENT_KEY, timeout=10) as s:
                raw = read_until(s, lambda b: b"\r\n\r\n" in b and b.rstrip().endswith(b"}"))
            assert raw.startswith(b"HTTP/1.1 200"), raw[:300]
        open_fds = len(list(Path(f"/proc/{proc.pid}/fd").iterdir()))
        assert open_fds < 512, open_fds
    finally:
        for s in flood:
            s.close()


def test_fd_exhaustion_is_logged_as_such_and_blames_no_backend(serve_limited: ServeLimited) -> None:
    # An explicit cap above what fits: the operator's choice, so descriptors do run out.
    port, proc = serve_limited(nofile=256, env={"GATEWAY_IDLE_TIMEOUT_S": "30",
                                                     "GATEWAY_MAX_CONNECTIONS": "100000"})
    warm = connect(port, timeout=10)
    _health_once(warm)  # a connection opened before the flood
    flood = _open_idle(port, 400)
    try:
        time.sleep(2.5)  # the descriptor check runs once a second
        body = orjson.dumps(CHAT)
        warm.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + CLIENT_KEY.encode() + b"\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)
        raw = read_until(warm, lambda b: b"\r\n\r\n" in b and b.rstrip().endswith(b"}"))
        status, _, err = _error(raw)
        assert (status, err["code"]) == (503, "gateway_out_of_file_descriptors")
        assert "unreachable" not in str(err["message"])
    finally:
        for s in flood:
            s.close()
        warm.close()
    ready = read_to_close_or_keep(_get(port, "/health/ready"))
    assert b'"state":"ok"' in ready.replace(b" ", b""), ready  # the backend was never marked down
    proc.terminate()
    proc.wait(15)
    assert proc.stderr is not None
    lines = [json.loads(line) for line in proc.stderr.read().decode().splitlines() if line.startswith("{")]
    fd_logs = [ln for ln in lines if "out of file descriptors" in ln["msg"]]
    assert fd_logs and fd_logs[0]["level"] == "error", lines[-20:]
    assert not [ln for ln in lines if "is down" in ln["msg"] or "unreachable" in ln["msg"]]


def _get(port: int, path: str) -> socket.socket:
    s = connect(port)
    s.sendall(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    return s


# -- HTTP/1.0 and half-close ----------------------------------------------------------------------

def test_http10_stream_is_close_delimited_not_chunked(gws: GatewayServer) -> None:
    body = orjson.dumps({**CHAT, "stream": True})
    with connect(gws.port) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + CLIENT_KEY.encode() + b"\r\nContent-Length: "
                  + str(len(body)).encode() + b"\r\n\r\n" + body)
        raw = read_to_close(s)
    head, _, payload = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert b"transfer-encoding" not in head.lower() and b"content-length" not in head.lower()
    assert payload.startswith(b"data: {") and payload.endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize("stream", [False, True])
def test_half_closed_client_still_gets_its_answer(gws: GatewayServer, fake: FakeVLLM, stream: bool) -> None:
    fake.behaviour.first_token_delay = 0.3  # the answer comes after the half-close
    with post_json(gws.port, "/v1/chat/completions", orjson.dumps({**CHAT, "stream": stream}), CLIENT_KEY) as s:
        s.shutdown(socket.SHUT_WR)
        status, _, payload = split_response(read_to_close(s))
    assert status == 200
    if stream:
        assert payload.rstrip().endswith(b"0")  # the last chunk of the chunked stream
        assert b"data: [DONE]" in payload
    else:
        assert orjson.loads(payload)["model"] == "public-chat"


def test_client_that_closes_during_a_generation_still_aborts_it(gws: GatewayServer, fake: FakeVLLM) -> None:
    """A full close looks like a half-close (FIN); the probe must still tell it apart."""
    fake.behaviour.first_token_delay = 10
    s = post_json(gws.port, "/v1/chat/completions", orjson.dumps(CHAT), CLIENT_KEY)
    assert fake.wait_for(lambda: fake.in_flight == 1)
    s.close()
    assert fake.wait_for(lambda: fake.aborted == 1, timeout=5)


# -- the health prober out of descriptors -----------------------------------------------------------

@contextlib.contextmanager
def _no_descriptor_left() -> Iterator[None]:
    """Make every new descriptor of this process fail with EMFILE (for a moment: restored on exit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest_free = os.open(os.devnull, os.O_RDONLY)  # POSIX: the lowest free number
    os.close(lowest_free)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_prober_out_of_descriptors_does_not_mark_a_backend_down(fake: FakeVLLM) -> None:
    config = parse_config(yaml.safe_dump(config_dict({"public-chat": [upstream(fake, name="fake0")]})), {})
    spec = config.models[0].upstreams[0]
    board = HealthBoard(["fake0"])

    async def probe_twice() -> ProbeResult:
        first = HealthMonitor(board, [spec], config.health)
        await first.probe_all()
        await first.stop()
        assert board.get("fake0").ok
        second = HealthMonitor(board, [spec], config.health)  # no pooled connection to reuse
        with _no_descriptor_left():
            result = await probe_upstream(second._client, spec, 2)
            await second.probe_all()
        await second.stop()
        return result

    result = asyncio.run(probe_twice())
    assert result.state is ProbeState.LOCAL_ERROR and "file descriptors" in result.detail
    assert board.get("fake0").ok  # today: "down", and every request to it refused until the next probe
