"""Graceful shutdown of a real `gateway serve` process with open streams (SIGTERM)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.fakes import FakeVLLM, Hang
from tests.integration.conftest import BACKEND_KEY, CLIENT_KEY
from tests.support.rawhttp import post_json, read_to_close, read_until, split_response


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def gateway_proc(tmp_path: Path, fake: FakeVLLM) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    cfg = {"models": [{"id": "public-chat", "upstreams": [{"name": "fake0", "url": fake.url, "model": "tiny",
                                                            "api_key": BACKEND_KEY}]}],
           "keys": [{"name": "ci", "key": CLIENT_KEY}]}
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(cfg))
    port = _free_port()
    env = {**os.environ, "GATEWAY_PORT": str(port), "GATEWAY_DRAIN_DELAY_S": "0.6",
           "GATEWAY_GRACEFUL_SHUTDOWN_S": "1.0", "GATEWAY_LOG_FORMAT": "text"}
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config", str(path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/health/ready", timeout=1).status_code == 200:
                    break
            assert time.monotonic() < deadline, "gateway did not become ready"
            time.sleep(0.05)
        yield port, proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


def _body(max_tokens: int) -> bytes:
    return (b'{"model":"public-chat","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":'
            + str(max_tokens).encode() + b"}")


def test_sigterm_drains_then_refuses_then_ends_open_streams_with_error_and_done(
    gateway_proc: tuple[int, subprocess.Popen[bytes]], fake: FakeVLLM
) -> None:
    port, proc = gateway_proc
    url = f"http://127.0.0.1:{port}"
    fake.behaviour.token_delay = 0.05  # 400 tokens: 20 s, far beyond the 1 s grace period
    fake.inject(Hang(), paths=["/v1/completions"])  # a non-streaming request still waiting at the end
    anthropic_body = (b'{"model":"public-chat","max_tokens":400,"stream":true,'
                      b'"messages":[{"role":"user","content":"hi"}]}')
    with post_json(port, "/v1/chat/completions", _body(400), CLIENT_KEY) as long_s, \
            post_json(port, "/v1/chat/completions", _body(20), CLIENT_KEY) as short_s, \
            post_json(port, "/v1/messages", anthropic_body, CLIENT_KEY) as anth_s, \
            post_json(port, "/v1/completions", b'{"model":"public-chat","prompt":"hi"}', CLIENT_KEY) as plain_s:
        long = read_until(long_s, lambda b: b.count(b"data: ") >= 2)
        short = read_until(short_s, lambda b: b.count(b"data: ") >= 1)
        anth = read_until(anth_s, lambda b: b.count(b"event: content_block_delta") >= 1)
        assert fake.wait_for(lambda: len(fake.requests_to("/v1/completions")) == 1)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        # 1. Not ready at once, while new connections are still served.
        while (r := httpx.get(url + "/health/ready", timeout=2)).status_code != 503:
            assert time.monotonic() - t0 < 0.5
            time.sleep(0.02)
        assert r.json()["status"] == "draining"
        assert httpx.get(url + "/health", timeout=2).status_code == 200
        # 2. After the drain delay, new connections are refused.
        while True:
            try:
                httpx.get(url + "/health", timeout=1)
            except (httpx.ConnectError, httpx.ReadError):
                # refused, or reset: a connection still in the accept queue when the listener closed
                break
            assert time.monotonic() - t0 < 3, "still accepting connections"
            time.sleep(0.02)
        assert time.monotonic() - t0 >= 0.55
        # 3. A stream that ends within the grace period ends normally ...
        short = read_until(short_s, lambda b: b.endswith(b"0\r\n\r\n"), short)
        assert b"data: [DONE]" in short and b'"error"' not in short
        # ... one that does not gets an error event and [DONE] when the grace period is over.
        long = read_until(long_s, lambda b: b.endswith(b"0\r\n\r\n"), long)
        took = time.monotonic() - t0
        anth = read_until(anth_s, lambda b: b.endswith(b"0\r\n\r\n"), anth)
        status, headers, body = split_response(read_to_close(plain_s))
    assert status == 503 and b'"code":"gateway_shutting_down"' in body and headers["x-should-retry"] == "true"
    assert b"event: error" in anth and b"gateway is shutting down" in anth  # Anthropic's own error event
    assert anth.rfind(b"event: error") > anth.rfind(b"event: content_block_delta")
    events = re.findall(rb"data: [^\n]*", long)
    assert b'"code":"gateway_shutting_down"' in events[-2] and events[-1] == b"data: [DONE]"
    assert 1.5 <= took < 4, took  # drain delay 0.6 s + grace 1 s
    assert proc.wait(10) in (0, -signal.SIGTERM)
    assert fake.wait_for(lambda: fake.in_flight == 0)  # the cut stream's generation was aborted upstream
