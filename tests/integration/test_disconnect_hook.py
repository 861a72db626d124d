"""How the app learns that its client left: the protocol's callback (gateway.http.disconnect), and the
ASGI ``receive()`` watcher the proxy falls back on under another server. Real uvicorn, real sockets."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
import uvloop
import yaml

from gateway.config import parse_config
from gateway.http.config import uvicorn_config
from gateway.http.disconnect import DISCONNECT_HOOK
from gateway.settings import Settings
from tests.fakes import FakeVLLM, Hang
from tests.integration.conftest import CLIENT_KEY, config_dict, upstream
from tests.support.gateway_server import GatewayServer

POST = b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}"


class _Serve:
    """``config`` served on a free port in a thread, until stopped."""

    def __init__(self, app: Any, config_for: Any) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(config_for(app))
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(self.server.serve(sockets=[self.sock]))

    def __enter__(self) -> _Serve:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "server did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


@pytest.fixture
def recorder() -> Iterator[tuple[list[str], _Serve]]:
    """A tiny app on the gateway's protocol: it watches for its client leaving, then answers after
    ``?`` (the path's delay) or when told its client left, and records what happened."""
    seen: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        hook = scope[DISCONNECT_HOOK]
        left = asyncio.Event()

        def on_gone() -> None:
            seen.append("gone")
            left.set()

        hook.on_disconnect = on_gone
        await receive()
        try:
            await asyncio.wait_for(left.wait(), 1.0 if scope["query_string"] == b"slow" else 0.0)
        except TimeoutError:
            pass
        if not left.is_set():
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"ok"})
            seen.append("answered")

    with _Serve(app, lambda a: uvicorn_config(a, Settings(), lifespan="off")) as srv:
        yield seen, srv


def _wait(pred: Any, timeout: float = 3.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


def test_the_protocol_calls_the_hook_once_when_the_client_leaves_mid_request(
    recorder: tuple[list[str], _Serve],
) -> None:
    seen, srv = recorder
    with socket.create_connection(("127.0.0.1", srv.port)) as c:
        c.sendall(POST.replace(b"/x", b"/x?slow"))
        time.sleep(0.2)
    assert _wait(lambda: seen == ["gone"])
    time.sleep(0.2)
    assert seen == ["gone"]


def test_the_hook_is_not_called_for_a_client_that_leaves_after_its_answer(
    recorder: tuple[list[str], _Serve],
) -> None:
    seen, srv = recorder
    with socket.create_connection(("127.0.0.1", srv.port)) as c:
        c.sendall(POST)
        assert c.recv(1024).startswith(b"HTTP/1.1 200")
    time.sleep(0.3)
    assert seen == ["answered"]


def test_the_proxy_without_the_hook_still_aborts_the_upstream_when_the_client_leaves(fake: FakeVLLM) -> None:
    """Under plain uvicorn (no gateway protocol, no hook) the proxy watches ``receive()``."""
    config = parse_config(yaml.safe_dump(config_dict({"public-chat": [upstream(fake)]})), {})
    gateway = GatewayServer(config, Settings(access_log=False))  # for its app only
    gateway._sock.close()

    def plain(app: Any) -> uvicorn.Config:
        return uvicorn.Config(app, loop="none", http="httptools", lifespan="on", log_config=None, access_log=False)

    with _Serve(gateway.app, plain) as srv:
        fake.inject(Hang())
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"http://127.0.0.1:{srv.port}/v1/chat/completions",
                       json={"model": "public-chat", "messages": [{"role": "user", "content": "hi"}]},
                       headers={"Authorization": f"Bearer {CLIENT_KEY}"}, timeout=0.5, trust_env=False)
        assert fake.wait_for(lambda: fake.aborted == 1, timeout=3)
        r = httpx.post(f"http://127.0.0.1:{srv.port}/v1/chat/completions",
                       json={"model": "public-chat", "messages": [{"role": "user", "content": "hi"}],
                             "max_tokens": 2},
                       headers={"Authorization": f"Bearer {CLIENT_KEY}"}, timeout=5, trust_env=False)
        assert r.status_code == 200, r.text
