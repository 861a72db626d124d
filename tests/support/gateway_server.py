"""Run the gateway on real uvicorn, on a free 127.0.0.1 port, in a background thread."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import uvicorn
import uvloop

from gateway.app import create_app
from gateway.config import parse_config
from gateway.config.schema import GatewayConfig
from gateway.http.config import uvicorn_config
from gateway.settings import Settings


class GatewayServer:
    def __init__(self, config: GatewayConfig, settings: Settings | None = None,
                 loader: Callable[[], GatewayConfig] | None = None) -> None:
        self.config = config
        self.settings = settings or Settings(access_log=False)
        self.app = create_app(self.settings, config, loader=loader)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        # The same uvicorn config as `gateway serve` (protocol, limits, timeouts), on this socket.
        cfg = uvicorn_config(self.app, self.settings, timeout_graceful_shutdown=2)
        self._server = uvicorn.Server(cfg)
        self._thread = threading.Thread(target=self._run, name=f"gateway-{self.port}", daemon=True)

    def _run(self) -> None:
        # The same event loop as `gateway serve` (uvicorn picks uvloop when it is installed).
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(self._server.serve(sockets=[self._sock]))

    @property
    def services(self) -> Any:
        return self.app.app.state.services  # type: ignore[attr-defined]

    def start(self) -> GatewayServer:
        self._thread.start()
        try:
            return self._wait_started()
        except BaseException:
            self.stop()  # no thread or socket outlives a failed start
            raise

    def _wait_started(self) -> GatewayServer:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self._server.started:
                try:
                    httpx.get(f"{self.url}/health", timeout=1, trust_env=False)
                    return self
                except httpx.HTTPError:
                    pass
            if not self._thread.is_alive():
                raise RuntimeError("gateway thread died during start-up")
            time.sleep(0.01)
        raise RuntimeError("gateway did not start within 15 s")

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()

    def __enter__(self) -> GatewayServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def config_from_yaml(text: str, env: dict[str, str] | None = None) -> GatewayConfig:
    return parse_config(text, env or {})
