"""Composition root: build every service from Settings + GatewayConfig and wire the ASGI app."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from starlette.routing import Route
from starlette.types import ASGIApp

from gateway import __version__
from gateway.accounting import NoUsage, UsageReader
from gateway.admin.service import AdminService
from gateway.admin.store import AdminSetupError, FileStore, RedisStore, StateStore
from gateway.api import admin as admin_routes
from gateway.api import admin_page, anthropic_routes, openai_routes, ops
from gateway.api.errors import install_exception_handlers
from gateway.api.middleware import RequestContextMiddleware
from gateway.api.proxy import ProxyEndpoint
from gateway.auth.admin import AdminKeys
from gateway.auth.keys import StaticKeyStore
from gateway.config.schema import GatewayConfig
from gateway.domain import Upstream
from gateway.errors import GatewayError
from gateway.lifecycle import Lifecycle
from gateway.mappings.snapshot import ModelTable
from gateway.observability.metrics import Metrics
from gateway.ratelimit.limiter import RateLimiter
from gateway.ratelimit.memory import MemoryLimiter
from gateway.ratelimit.redis_limiter import RedisLimiter
from gateway.ratelimit.service import RateLimits
from gateway.ratelimit.usage import RedisUsageReader, UsageRecorder
from gateway.redis_client import connect, is_cluster_url
from gateway.routing.breaker import CIRCUIT_GAUGE, BreakerBoard
from gateway.routing.health import HealthBoard, HealthMonitor
from gateway.routing.load import LoadBoard, Scrape
from gateway.routing.probe import ProbeResult
from gateway.routing.scrape import MetricsScraper, scrape_targets
from gateway.routing.selector import Selector
from gateway.services import Services
from gateway.settings import Settings
from gateway.upstream.client import UpstreamClients
from gateway.upstream.forward import Forwarder
from gateway.upstream.headers import allow_set
from gateway.upstream.transport import LeanTransport


def _log_reload(task: asyncio.Task[object]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logging.getLogger("gateway.admin").error("SIGHUP reload failed: %s", task.exception())


def build_services(settings: Settings, config: GatewayConfig, lifecycle: Lifecycle | None = None) -> Services:
    metrics = Metrics(multiprocess_dir=settings.metrics_dir)
    table = ModelTable.from_config(config)
    breakers = BreakerBoard((), config.breaker.failures, config.breaker.cool_down_s)
    breakers.listeners.append(
        lambda name, t: metrics.upstream_circuit_state.labels(name).set(CIRCUIT_GAUGE[t.new]))
    breakers.add(u.name for u in table.upstreams())
    board = HealthBoard((u.name for u in table.upstreams()), breakers)
    model_of = {u.name: u.model_id for u in table.upstreams()}

    def on_probe(name: str, result: ProbeResult) -> None:
        model = model_of.get(name)
        if model is not None:  # not a backend removed while a request or probe to it was running
            metrics.upstream_up.labels(name, model).set(1 if result.ok else 0)

    board.listeners.append(on_probe)

    def on_error(up: Upstream, err: GatewayError) -> None:
        if err.status < 500:  # the client's mistake, as the backend judged it: not a backend failure
            metrics.upstream_client_errors.labels(up.name, err.code or f"http_{err.status}").inc()
        else:
            metrics.upstream_errors.labels(up.name, err.code or "error").inc()

    load = LoadBoard(config.routing.metrics_stale_s)
    load.add(u.name for u in table.upstreams())
    load.in_flight_listeners.append(metrics.set_upstream_in_flight)

    def on_scrape(name: str, scrape: Scrape | None) -> None:
        metrics.upstream_metrics_ok.labels(name).set(0 if scrape is None else 1)
        if scrape is not None:
            metrics.upstream_waiting.labels(name).set(scrape.waiting)
            metrics.upstream_running.labels(name).set(scrape.running)
            metrics.upstream_kv_usage.labels(name).set(scrape.kv_usage)

    load.scrape_listeners.append(on_scrape)
    scraper = MetricsScraper(load, config.routing, scrape_targets(table.entries.values()),
                             transport=LeanTransport(max_connections=8, max_idle=8))
    selector = Selector(board, load)
    selector.on_shed = lambda entry: metrics.shed.labels(entry.id).inc()
    clients = UpstreamClients(config.timeouts)
    forwarder = Forwarder(clients, selector, board, config.timeouts, config.retry, config.limits,
                          on_error=on_error, forward_allow=allow_set(config.forward_headers.allow),
                          breakers=breakers,
                          on_retry=lambda model, reason: metrics.retries.labels(model, reason).inc(),
                          on_fallback=lambda a, b: metrics.fallbacks.labels(a, b).inc())
    monitor = HealthMonitor(board, [u.spec for u in table.upstreams()], config.health)
    key_names: list[str] = [k.name for k in config.keys]
    ratelimits, usage, reader = build_rate_limits(settings, config, metrics, lambda: key_names)
    services = Services(settings, config, StaticKeyStore(config.keys), table, board, monitor, clients,
                        forwarder, metrics, ratelimits, usage, reader, lifecycle or Lifecycle(),
                        load=load, scraper=scraper)

    def on_upstreams_changed(added: list[Upstream], removed: list[Upstream]) -> None:
        # The holders of per-upstream state, told which backends came and went (Services.apply).
        for u in removed:
            board.forget(u.name)
            breakers.remove([u.name])
            load.remove([u.name])
            model_of.pop(u.name, None)
            metrics.forget_upstream(u.name)
            clients.retire(u)
        for u in added:
            board.add(u.name)
            breakers.add([u.name])
            load.add([u.name])
            model_of[u.name] = u.model_id
        scraper.set_upstreams(scrape_targets(services.table.entries.values()))
        monitor.set_upstreams([u.spec for u in services.table.upstreams()], [u.spec for u in added])
        key_names[:] = [k.name for k in services.config.keys]

    services.upstream_listeners.append(on_upstreams_changed)
    return services


def build_rate_limits(settings: Settings, config: GatewayConfig, metrics: Metrics,
                      key_names: Callable[[], list[str]] | None = None,
                      ) -> tuple[RateLimits, UsageRecorder, UsageReader]:
    """Limits and usage in Redis when GATEWAY_REDIS_URL is set, else in this process's memory."""
    spec = config.rate_limits
    redis = connect(settings.redis_url, spec.redis_timeout_ms / 1000) if settings.redis_url else None
    limiter: RateLimiter = MemoryLimiter() if redis is None else RedisLimiter(
        redis, is_cluster_url(settings.redis_url or ""))
    usage = UsageRecorder(redis)

    def on_refused(key: str, model: str, kind: str) -> None:
        metrics.rate_limited.labels(key, kind).inc()
        usage.refused(key, model)

    ratelimits = RateLimits(spec, limiter, hold_ms=int(config.timeouts.total * 1000) + 60_000,
                            shared=redis is not None, on_refused=on_refused,
                            on_failure=metrics.rate_limiter_errors.inc)
    names = [k.name for k in config.keys]
    reader: UsageReader = NoUsage() if redis is None else RedisUsageReader(redis, key_names or (lambda: names))
    return ratelimits, usage, reader


def state_file(settings: Settings, config: GatewayConfig) -> Path:
    """GATEWAY_STATE_FILE, else admin.state_file (relative to the config file), else
    gateway-state.json beside the config file."""
    if settings.state_file is not None:
        return settings.state_file
    if config.admin.state_file:
        p = Path(config.admin.state_file)
        return p if p.is_absolute() else settings.config.parent / p
    return settings.config.parent / "gateway-state.json"


def build_admin(settings: Settings, config: GatewayConfig, services: Services,
                loader: Callable[[], GatewayConfig] | None) -> tuple[AdminService | None, AdminKeys]:
    """The admin API's service and keys; no service (the API off) without an admin key."""
    env_key = settings.admin_key.get_secret_value() if settings.admin_key else None
    if env_key and (len(env_key) < 16 or env_key.upper().startswith(("CHANGE_ME", "REPLACE_ME"))):
        raise AdminSetupError("GATEWAY_ADMIN_KEY is a placeholder or shorter than 16 characters; set a long "
                              "random value (e.g. `openssl rand -hex 32`), or unset it to turn the admin API off")
    keys = AdminKeys(config.admin.keys, env_key)
    if not keys.enabled:
        return None, keys
    store: StateStore
    if settings.redis_url:
        store = RedisStore(connect(settings.redis_url, 2.0, max_connections=16),
                           cluster=is_cluster_url(settings.redis_url), audit_size=config.admin.audit_size)
    else:
        fstore = FileStore(state_file(settings, config), audit_size=config.admin.audit_size)
        fstore.check_writable()  # a clear start-up error (StoreError) when it cannot be written
        store = fstore
    return AdminService(config, store, services.apply, loader=loader), keys


def create_app(settings: Settings, config: GatewayConfig, lifecycle: Lifecycle | None = None,
               loader: Callable[[], GatewayConfig] | None = None, freeze_heap: bool = False) -> ASGIApp:
    """``lifecycle``: shared with the server that runs the app (graceful shutdown drives it);
    ``loader`` reads the config file again (SIGHUP, POST /admin/reload); ``freeze_heap``: once started,
    move everything start-up built out of the garbage collector's sight (``gc.freeze``), for a process
    that runs this one app (``gateway serve``)."""
    services = build_services(settings, config, lifecycle)
    admin, admin_keys = build_admin(settings, config, services, loader)

    def on_sighup() -> None:
        if admin is None:
            return
        task = asyncio.get_running_loop().create_task(admin.reload())
        task.add_done_callback(_log_reload)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if admin is not None:
            await admin.start()  # the stored overlay is served before the first request
            with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):  # not the main thread
                asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, on_sighup)
        await services.monitor.start()
        await services.scraper.start()
        services.lifecycle.started = True

        services.usage.start()
        if freeze_heap:
            # The ~85,000 objects start-up made (modules, FastAPI, pydantic, config) live as long as the
            # process; a full collection scanned them all (~80 ms, every stream on hold) whenever requests
            # had promoted enough objects. Frozen, collections look only at what requests made.
            gc.collect()
            gc.freeze()
        try:
            yield
        finally:
            services.lifecycle.draining = True
            if admin is not None:
                with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
                    asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
                await admin.stop()
            await services.monitor.stop()
            await services.scraper.stop()
            await services.usage.stop()
            await services.ratelimits.aclose()
            await services.clients.aclose()
            services.metrics.close()

    app = FastAPI(title="vllm-gateway", version=__version__, lifespan=lifespan,
                  docs_url="/docs", redoc_url=None)
    app.state.services = services
    install_exception_handlers(app)
    router = openai_routes.build_router(services)
    app.include_router(router)
    app.include_router(ops.build_router(services))
    app.include_router(anthropic_routes.build_router(services))
    app.state.admin = admin
    app.state.admin_keys = admin_keys
    app.include_router(admin_routes.build_router(services, admin, admin_keys))
    app.include_router(admin_page.build_router(lambda: admin is not None))  # the page: off with the API
    fast: dict[str, ProxyEndpoint] = {}
    for r in router.routes:
        if isinstance(r, Route) and isinstance(r.app, ProxyEndpoint):
            fast[r.path] = r.app
    return RequestContextMiddleware(app, services.metrics, settings.access_log, fast_posts=fast)
