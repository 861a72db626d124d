"""The services one gateway app runs on, built once by the composition root (``gateway.app``)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.auth.keys import StaticKeyStore
from gateway.config.schema import GatewayConfig
from gateway.mappings.snapshot import ModelTable
from gateway.observability.metrics import Metrics
from gateway.routing.health import HealthBoard, HealthMonitor
from gateway.settings import Settings
from gateway.upstream.client import UpstreamClients
from gateway.upstream.forward import Forwarder


@dataclass
class Services:
    settings: Settings
    config: GatewayConfig
    keys: StaticKeyStore
    table: ModelTable
    board: HealthBoard
    monitor: HealthMonitor
    clients: UpstreamClients
    forwarder: Forwarder
    metrics: Metrics
