"""Composition root: build every service from Settings + GatewayConfig and wire the ASGI app."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.routing import Route
from starlette.types import ASGIApp

from gateway import __version__
from gateway.api import openai_routes, ops
from gateway.api.errors import install_exception_handlers
from gateway.api.middleware import RequestContextMiddleware
from gateway.api.proxy import ProxyEndpoint
from gateway.auth.keys import StaticKeyStore
from gateway.config.schema import GatewayConfig
from gateway.domain import Upstream
from gateway.errors import GatewayError
from gateway.mappings.snapshot import ModelTable
from gateway.observability.metrics import Metrics
from gateway.routing.health import HealthBoard, HealthMonitor
from gateway.routing.probe import ProbeResult
from gateway.routing.selector import Selector
from gateway.services import Services
from gateway.settings import Settings
from gateway.upstream.client import UpstreamClients
from gateway.upstream.forward import Forwarder


def build_services(settings: Settings, config: GatewayConfig) -> Services:
    metrics = Metrics(multiprocess_dir=settings.metrics_dir)
    table = ModelTable.from_config(config)
    board = HealthBoard(u.name for u in table.upstreams())
    model_of = {u.name: u.model_id for u in table.upstreams()}

    def on_probe(name: str, result: ProbeResult) -> None:
        metrics.upstream_up.labels(name, model_of.get(name, "-")).set(1 if result.ok else 0)

    board.listeners.append(on_probe)

    def on_error(up: Upstream, err: GatewayError) -> None:
        metrics.upstream_errors.labels(up.name, err.code or "error").inc()

    clients = UpstreamClients(config.timeouts)
    forwarder = Forwarder(clients, Selector(board), board, config.timeouts, config.retry, config.limits,
                          on_error=on_error)
    monitor = HealthMonitor(board, [u.spec for u in table.upstreams()], config.health)
    return Services(settings, config, StaticKeyStore(config.keys), table, board, monitor, clients,
                    forwarder, metrics)


def create_app(settings: Settings, config: GatewayConfig) -> ASGIApp:
    services = build_services(settings, config)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await services.monitor.start()
        try:
            yield
        finally:
            await services.monitor.stop()
            await services.clients.aclose()
            services.metrics.close()

    app = FastAPI(title="vllm-gateway", version=__version__, lifespan=lifespan,
                  docs_url="/docs", redoc_url=None)
    app.state.services = services
    install_exception_handlers(app)
    router = openai_routes.build_router(services)
    app.include_router(router)
    app.include_router(ops.build_router(services))
    fast: dict[str, ProxyEndpoint] = {}
    for r in router.routes:
        if isinstance(r, Route) and isinstance(r.app, ProxyEndpoint):
            fast[r.path] = r.app
    return RequestContextMiddleware(app, services.metrics, settings.access_log, fast_posts=fast)
