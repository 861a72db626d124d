"""Run the app on uvicorn: one process, or N workers re-created from the environment."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path

from starlette.types import ASGIApp
from uvicorn.supervisors import Multiprocess

from gateway.admin.store import AdminSetupError
from gateway.app import create_app
from gateway.config import load_config
from gateway.config.schema import GatewayConfig
from gateway.http.config import uvicorn_config
from gateway.http.shutdown import CUT_MARGIN_S, DrainingServer
from gateway.lifecycle import Lifecycle
from gateway.observability.logging import configure_logging
from gateway.settings import Settings


def worker_app() -> ASGIApp:
    """Factory for each worker process when ``workers > 1`` (settings come from GATEWAY_*)."""
    settings = Settings()
    configure_logging(settings.log_level, settings.log_format)
    return create_app(settings, load_config(settings.config, os.environ),
                      loader=lambda: load_config(settings.config, os.environ), freeze_heap=True)


def run_server(settings: Settings, config: GatewayConfig) -> int:
    configure_logging(settings.log_level, settings.log_format)
    limited = any(s.limited() or any(p.limited() for p in getattr(s, "per_model", {}).values())
                  for s in [*config.keys, *config.models])
    if settings.workers > 1 and not settings.redis_url and limited:
        logging.getLogger("gateway").warning(
            "rate limits without GATEWAY_REDIS_URL and with %d workers: each worker limits separately, so "
            "together they admit up to %d times each limit; set GATEWAY_REDIS_URL to share the buckets",
            settings.workers, settings.workers)
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
        if settings.redis_url:
            os.environ["GATEWAY_REDIS_URL"] = settings.redis_url
        # The config (protocol and limits included) is handed to every worker process.
        cfg = uvicorn_config("gateway.server:worker_app", settings, factory=True, workers=settings.workers)
        Multiprocess(cfg, sockets=[cfg.bind_socket()]).run()
        return 0
    lifecycle = Lifecycle()
    try:
        app = create_app(settings, config, lifecycle, loader=lambda: load_config(settings.config, os.environ),
                         freeze_heap=True)
    except AdminSetupError as exc:
        logging.getLogger("gateway").error("%s", exc)
        print(f"gateway: {exc}", file=sys.stderr)
        return 2
    cfg = uvicorn_config(app, settings, timeout_graceful_shutdown=settings.graceful_shutdown_s + CUT_MARGIN_S)
    server = DrainingServer(cfg, lifecycle, settings.drain_delay_s, settings.graceful_shutdown_s)
    server.run()
    return 0 if server.started else 3
