"""Configuration: typed schema (``schema``) and file loading (``loader``)."""

from gateway.config.loader import ConfigError, load_config, parse_config
from gateway.config.schema import (
    GatewayConfig,
    KeySpec,
    LaunchSpec,
    ModelSpec,
    NcclSpec,
    UpstreamSpec,
)

__all__ = [
    "ConfigError",
    "GatewayConfig",
    "KeySpec",
    "LaunchSpec",
    "ModelSpec",
    "NcclSpec",
    "UpstreamSpec",
    "load_config",
    "parse_config",
]
