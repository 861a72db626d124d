"""Process settings (where the config is, where to listen), from the environment or the CLI.

``GATEWAY_`` prefix: ``GATEWAY_CONFIG``, ``GATEWAY_HOST``, ``GATEWAY_PORT``, ``GATEWAY_WORKERS``,
``GATEWAY_REDIS_URL``, ``GATEWAY_LOG_LEVEL``, ``GATEWAY_LOG_FORMAT``, ``GATEWAY_METRICS_DIR``.
Nothing here is read at import: the CLI builds one :class:`Settings` and passes it down.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GATEWAY_", extra="ignore", frozen=True)

    config: Path = Path("config/gateway.yaml")
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    workers: int = Field(default=1, ge=1)
    redis_url: str | None = None
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "text"] = "json"
    access_log: bool = True
    graceful_shutdown_s: float = Field(default=30.0, ge=0)
    # With workers > 1: where each worker writes its metric files, so /metrics adds up all workers
    # (created in the temp dir when unset).
    metrics_dir: Path | None = None
