"""Notice file-descriptor exhaustion on the client side and log it as what it is.

With uvloop, libuv meets EMFILE/ENFILE on ``accept()`` silently: it accepts and closes the pending
connections (its "EMFILE trick") and tells nobody, so clients see resets and the log stays empty. A
one-descriptor probe once a second notices the state instead; asyncio's own loop reports the accept
error to the loop's exception handler, which is routed here too. Upstream and health-probe
connections that fail with EMFILE are reported where they happen (gateway.upstream, gateway.routing).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import time
from collections.abc import Callable
from typing import Any

from gateway.errors import is_fd_exhaustion

log = logging.getLogger("gateway.server")

_CHECK_EVERY_S = 1.0
_LOG_EVERY_S = 10.0


class FdWatch:
    """One per event loop: checks once a second that a descriptor can still be opened."""

    def __init__(self, loop: asyncio.AbstractEventLoop, connections: Callable[[], int]) -> None:
        self.loop = loop
        self.connections = connections
        self.exhausted = False
        self._last_log = -_LOG_EVERY_S
        self._previous_handler = loop.get_exception_handler()
        loop.set_exception_handler(self._exception_handler)
        self._timer = loop.call_later(_CHECK_EVERY_S, self._check)

    def _check(self) -> None:
        try:
            fd = os.open(os.devnull, os.O_RDONLY)
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                self.report(exc)
            else:
                raise
        else:
            os.close(fd)
            if self.exhausted:
                self.exhausted = False
                log.warning("file descriptors available again (%d client connections open)",
                            self.connections())
        self._timer = self.loop.call_later(_CHECK_EVERY_S, self._check)

    def report(self, exc: OSError) -> None:
        self.exhausted = True
        now = time.monotonic()
        if now - self._last_log < _LOG_EVERY_S:
            return
        self._last_log = now
        name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        log.error("out of file descriptors (%s: %s): new client connections are dropped at accept; "
                  "%d client connections open, open-file limit %d. Raise the limit (ulimit -n, "
                  "LimitNOFILE=) or lower GATEWAY_MAX_CONNECTIONS; the backends are not at fault",
                  name, exc.strerror, self.connections(), resource.getrlimit(resource.RLIMIT_NOFILE)[0],
                  extra={"error_code": "out_of_file_descriptors"})

    def _exception_handler(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and is_fd_exhaustion(exc):
            self.report(exc)
        elif self._previous_handler is not None:
            self._previous_handler(loop, context)
        else:
            loop.default_exception_handler(context)

    def close(self) -> None:
        self._timer.cancel()
