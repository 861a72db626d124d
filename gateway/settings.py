"""Process settings (where the config is, where to listen), from the environment or the CLI.

``GATEWAY_`` prefix: ``GATEWAY_CONFIG``, ``GATEWAY_HOST``, ``GATEWAY_PORT``, ``GATEWAY_WORKERS``,
``GATEWAY_REDIS_URL``, ``GATEWAY_GRACEFUL_SHUTDOWN_S``, ``GATEWAY_DRAIN_DELAY_S``,
``GATEWAY_LOG_LEVEL``, ``GATEWAY_LOG_FORMAT``, ``GATEWAY_METRICS_DIR``, and the
client-connection limits (``GATEWAY_MAX_HEAD_BYTES``, ``GATEWAY_HEADER_TIMEOUT_S``,
``GATEWAY_BODY_TIMEOUT_S``, ``GATEWAY_IDLE_TIMEOUT_S``, ``GATEWAY_MAX_CONNECTIONS``; see docs/hardening.md),
the admin API's ``GATEWAY_ADMIN_KEY`` and ``GATEWAY_STATE_FILE`` (docs/admin.md).
Nothing here is read at import: the CLI builds one :class:`Settings` and passes it down.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
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
    graceful_shutdown_s: float = Field(default=30.0, ge=0)  # open streams may finish this long (docs/resilience.md)
    drain_delay_s: float = Field(default=5.0, ge=0)  # SIGTERM: not ready for this long before refusing connections
    # With workers > 1: where each worker writes its metric files, so /metrics adds up all workers
    # (created in the temp dir when unset).
    metrics_dir: Path | None = None
    # Client connections (docs/hardening.md): request line + headers at most this many bytes (414/431),
    # the whole head within header_timeout_s and the body within body_timeout_s of the head (408),
    # idle connections (before a request, between keep-alive requests) closed after idle_timeout_s,
    # at most max_connections per process (unset: 10,000, lowered to fit the open-file limit).
    max_head_bytes: int = Field(default=65536, ge=1024)
    header_timeout_s: float = Field(default=10.0, gt=0)
    body_timeout_s: float = Field(default=60.0, gt=0)
    idle_timeout_s: float = Field(default=5.0, gt=0)
    max_connections: int | None = Field(default=None, ge=1)
    # The admin API (docs/admin.md): an admin key (besides the config's admin.keys), and where the file
    # store keeps admin edits (default: admin.state_file, else gateway-state.json beside the config).
    admin_key: SecretStr | None = None
    state_file: Path | None = None
