"""A client that reads its stream slowly (issue 6, item 6), over real sockets.

The fake streams a long answer as fast as it can; the client's receive buffer is tiny and it stops
reading, so the gateway's writes block once the kernel buffers and uvicorn's are full. Time blocked
on the client is not upstream silence: a reader that resumes gets the whole stream; one that stays
stalled beyond ``timeouts.client_stall`` is cut as the client's failure, and the backend is not blamed.
"""

from __future__ import annotations

import logging
import socket
import time

import httpx
import orjson
import pytest

from tests.fakes.plugin import FakeVLLMFactory
from tests.integration.conftest import CLIENT_KEY, GatewayFactory, upstream

# About 10 MB of SSE (8 choices x 3000 tokens with per-event usage): more than every buffer between
# the gateway and the client (loopback send buffers grow to 4 MiB).
LONG_STREAM = orjson.dumps({
    "model": "public-chat", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 3000, "n": 8,
    "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
})


def _stalled_client(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: no window autotuning
    s.settimeout(60)
    s.connect(("127.0.0.1", port))
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Authorization: Bearer " + CLIENT_KEY.encode() + b"\r\nConnection: close\r\n"
              b"Content-Length: " + str(len(LONG_STREAM)).encode() + b"\r\n\r\n" + LONG_STREAM)
    return s


def _read_all(s: socket.socket) -> bytes:
    parts = []
    while data := s.recv(1 << 20):
        parts.append(data)
    return b"".join(parts)


def test_a_reader_that_pauses_longer_than_idle_gets_the_whole_stream(
    start_gateway: GatewayFactory, fake_vllm: FakeVLLMFactory
) -> None:
    fake = fake_vllm(max_model_len=8192)
    gw = start_gateway({"public-chat": [upstream(fake, name="fake0")]}, timeouts={"idle": 1.0})
    with _stalled_client(gw.port) as s:
        # Stalled well past the idle limit while the fake has long finished writing.
        assert fake.wait_for(lambda: fake.completed == 1, timeout=30)
        time.sleep(4.0)  # the stall under test (not synchronisation): 4 x the idle limit
        got = _read_all(s)
    assert got.startswith(b"HTTP/1.1 200")
    assert b"data: [DONE]" in got and b"upstream_timeout" not in got and b"sent nothing" not in got
    assert got.count(b'"finish_reason":"length"') == 8
    text = httpx.get(gw.url + "/metrics").text
    assert "gateway_upstream_errors_total{" not in text


def test_a_reader_stalled_beyond_the_limit_is_cut_as_the_clients_failure(
    start_gateway: GatewayFactory, fake_vllm: FakeVLLMFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    fake = fake_vllm(max_model_len=8192)
    fake.behaviour.token_delay = 0.002  # still generating when the gateway gives up on the client
    gw = start_gateway({"public-chat": [upstream(fake, name="fake0")]},
                       timeouts={"idle": 1.0, "client_stall": 2.0})
    with _stalled_client(gw.port) as s:
        assert fake.wait_for(lambda: fake.aborted == 1, timeout=30), "the generation was not aborted"
        s.settimeout(30)
        got = _read_all(s)  # the gateway closed the connection: the read ends
    assert got.startswith(b"HTTP/1.1 200") and b"data: [DONE]" not in got[-4096:]
    assert fake.completed == 0
    text = httpx.get(gw.url + "/metrics").text
    assert "gateway_upstream_errors_total{" not in text  # the backend is not blamed
    assert 'gateway_client_stalls_total{model="public-chat",route="/v1/chat/completions"} 1.0' in text
    assert 'gateway_requests_total{model="public-chat",route="/v1/chat/completions",status_class="4xx"} 1.0' in text
    stalls = [r for r in caplog.records if getattr(r, "error_code", None) == "client_stalled"]
    assert len(stalls) == 1 and "not at fault" in stalls[0].getMessage()
    assert not [r for r in caplog.records if r.name == "gateway.upstream" and r.levelno >= logging.WARNING]
