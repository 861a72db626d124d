"""Run the app on uvicorn: one process, or N workers re-created from the environment."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import uvicorn
from starlette.types import ASGIApp

from gateway.app import create_app
from gateway.config import load_config
from gateway.config.schema import GatewayConfig
from gateway.observability.logging import configure_logging
from gateway.settings import Settings


def _uvicorn_kwargs(settings: Settings) -> dict[str, object]:
    return {
        "host": settings.host,
        "port": settings.port,
        "log_config": None,
        "access_log": False,
        "timeout_graceful_shutdown": settings.graceful_shutdown_s,
        "server_header": False,
        "proxy_headers": False,
    }


def worker_app() -> ASGIApp:
    """Factory for each worker process when ``workers > 1`` (settings come from GATEWAY_*)."""
    settings = Settings()
    configure_logging(settings.log_level, settings.log_format)
    return create_app(settings, load_config(settings.config, os.environ))


def run_server(settings: Settings, config: GatewayConfig) -> int:
    configure_logging(settings.log_level, settings.log_format)
    if settings.redis_url:
        logging.getLogger("gateway").warning(
            "GATEWAY_REDIS_URL is set, but this version keeps all state (keys, mappings) in the config "
            "file and each process; nothing is shared through Redis yet")
    if settings.workers > 1:
        # Workers are separate processes: hand them the same settings through the environment,
        # and a fresh directory for their metric files (read at prometheus_client's import).
        metrics_dir = settings.metrics_dir or Path(tempfile.mkdtemp(prefix="gateway-metrics-"))
        metrics_dir.mkdir(parents=True, exist_ok=True)
        for stale in metrics_dir.glob("*.db"):
            stale.unlink()
        os.environ.update({
            "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir), "GATEWAY_METRICS_DIR": str(metrics_dir),
            "GATEWAY_CONFIG": str(settings.config), "GATEWAY_HOST": settings.host,
            "GATEWAY_PORT": str(settings.port), "GATEWAY_LOG_LEVEL": settings.log_level,
            "GATEWAY_LOG_FORMAT": settings.log_format,
        })
        uvicorn.run("gateway.server:worker_app", factory=True, workers=settings.workers,
                    **_uvicorn_kwargs(settings))  # type: ignore[arg-type]
        return 0
    uvicorn.run(create_app(settings, config), **_uvicorn_kwargs(settings))  # type: ignore[arg-type]
    return 0
