"""The services one gateway app runs on, built once by the composition root (``gateway.app``).

``Services.apply`` is the one place a new mapping goes live (admin edits, reload): it builds the new
immutable :class:`ModelTable` and key store, swaps the references (in-flight requests keep the objects
they hold), and tells every per-upstream state holder which upstreams came and went through the
``upstream_listeners`` list (``listener(added, removed)``; an upstream whose URL, served name, key, proxy
or pool size changed is in both lists; a weight-only change, such as a drain, is in neither).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.accounting import UsageReader
from gateway.auth.keys import StaticKeyStore
from gateway.config.live import live_update
from gateway.config.schema import GatewayConfig, RoutingSpec
from gateway.domain import Upstream
from gateway.lifecycle import Lifecycle
from gateway.mappings.snapshot import ModelTable
from gateway.observability.metrics import Metrics
from gateway.ratelimit.service import RateLimits
from gateway.ratelimit.usage import UsageRecorder
from gateway.routing.health import HealthBoard, HealthMonitor
from gateway.routing.load import LoadBoard
from gateway.routing.scrape import MetricsScraper
from gateway.settings import Settings
from gateway.upstream.client import UpstreamClients
from gateway.upstream.forward import Forwarder

UpstreamsChanged = Callable[[list[Upstream], list[Upstream]], None]


def _identity(u: Upstream) -> tuple[object, ...]:
    """What makes an upstream a different backend (its weight does not)."""
    s = u.spec
    return (u.model_id, u.base_url, u.served_name, s.api_key_value(), s.proxy, s.max_connections)


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
    ratelimits: RateLimits
    usage: UsageRecorder
    usage_reader: UsageReader
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    # Load routing: in-flight counts and /metrics scrapes per upstream. After a live model-table swap, on
    # the loop: `load.set_upstreams(u.name for u in table.upstreams())` and
    # `scraper.set_upstreams(scrape_targets(table.entries.values()))` (docs/routing.md).
    load: LoadBoard = field(default_factory=LoadBoard)
    scraper: MetricsScraper = field(default_factory=lambda: MetricsScraper(LoadBoard(), RoutingSpec()))
    upstream_listeners: list[UpstreamsChanged] = field(default_factory=list)

    def apply(self, config: GatewayConfig, version: int) -> tuple[list[Upstream], list[Upstream]]:
        """Serve ``config``'s models and keys from now on (its other sections need a restart)."""
        config = live_update(self.config, config)
        old = {u.name: u for u in self.table.upstreams()}
        table = ModelTable.from_config(config, version=version, previous=self.table)
        new = {u.name: u for u in table.upstreams()}
        removed = [u for n, u in old.items() if n not in new or _identity(u) != _identity(new[n])]
        added = [u for n, u in new.items() if n not in old or _identity(old[n]) != _identity(u)]
        keys = StaticKeyStore(config.keys)
        # The swap: one assignment each, on the event loop; a request holds the objects it started with.
        self.table, self.keys, self.config = table, keys, config
        self.metrics.config_version.set(version)
        for listener in self.upstream_listeners:
            listener(added, removed)
        return added, removed
