"""The one uvicorn configuration: used by ``gateway serve`` (one process or N workers) and the tests."""

from __future__ import annotations

import functools
from typing import Any

import uvicorn

from gateway.http.limits import ServerLimits, raise_open_file_limit
from gateway.http.protocol import GatewayHttpProtocol
from gateway.settings import Settings


def uvicorn_config(app: Any, settings: Settings, **overrides: Any) -> uvicorn.Config:
    """uvicorn on uvloop + httptools with the gateway's protocol and limits.

    Raises the process's open-file limit to its hard limit first (children inherit it), and fits
    the default connection cap to it. ``app`` is the ASGI app, or an import string with
    ``factory=True`` for workers; ``overrides`` are further uvicorn.Config arguments.
    """
    limits = ServerLimits.from_settings(settings, raise_open_file_limit())
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "loop": "uvloop",
        "http": functools.partial(GatewayHttpProtocol, limits=limits),
        "ws": "none",
        "lifespan": "on",
        "log_config": None,
        "access_log": False,
        "timeout_graceful_shutdown": settings.graceful_shutdown_s,
        "timeout_keep_alive": max(1, round(settings.idle_timeout_s)),  # the protocol uses the exact value
        "server_header": False,
        "proxy_headers": False,
    }
    options.update(overrides)
    return uvicorn.Config(app, **options)
