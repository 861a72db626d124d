"""Graceful shutdown for ``gateway serve`` (one process): drain first, then stop.

On SIGTERM (an orchestrator stopping the pod):

1. ``/health/ready`` turns 503 at once (``Lifecycle.draining``); everything else keeps working, new
   connections included, so load balancers notice and stop sending new traffic;
2. after ``GATEWAY_DRAIN_DELAY_S`` the listening socket closes (new connections are refused) and
   idle keep-alive connections are closed; requests in progress go on;
3. open streams may finish for up to ``GATEWAY_GRACEFUL_SHUTDOWN_S``; those still open then get the
   route's error event (code ``gateway_shutting_down``) and their end (``data: [DONE]`` on the OpenAI
   routes), requests not answered yet get 503 ``gateway_shutting_down``, and the process exits
   (uvicorn cancels whatever is left a moment later).

SIGINT (Ctrl-C) skips the drain delay; a second SIGINT or SIGTERM stops at once.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from types import FrameType

import uvicorn

from gateway.lifecycle import Lifecycle

log = logging.getLogger("gateway.shutdown")

CUT_MARGIN_S = 2.0  # uvicorn's own cancel comes this long after the gateway ended the streams itself


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, lifecycle: Lifecycle, drain_delay_s: float, grace_s: float) -> None:
        super().__init__(config)
        self.lifecycle = lifecycle
        self.drain_delay_s = drain_delay_s
        self.grace_s = grace_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain: asyncio.Task[None] | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.lifecycle.draining or self._loop is None or not self.started:
            super().handle_exit(sig, frame)
            return
        self.lifecycle.draining = True
        self._captured_signals.append(sig)
        delay = self.drain_delay_s if sig == signal.SIGTERM else 0.0
        self._loop.call_soon_threadsafe(self._begin, delay)

    def _begin(self, delay: float) -> None:
        self._drain = asyncio.get_running_loop().create_task(self._run_drain(delay), name="gateway-drain")

    async def _run_drain(self, delay: float) -> None:
        log.info("shutting down: not ready; refusing new connections in %gs, open streams end within %gs more",
                 delay, self.grace_s)
        await asyncio.sleep(delay)
        self.should_exit = True  # uvicorn closes the listener, then waits for the open connections
        await asyncio.sleep(self.grace_s)
        n = self.lifecycle.cut_streams()
        if n:
            log.warning("graceful shutdown period of %gs over: ended %d open stream(s) with an error event",
                        self.grace_s, n)


__all__ = ["CUT_MARGIN_S", "DrainingServer"]
