"""Prometheus metrics on a registry of the app's own (two apps can live in one process).

With several worker processes (``gateway serve --workers N``) every worker writes its values to files
in one directory (prometheus_client's multiprocess mode, switched on by ``PROMETHEUS_MULTIPROC_DIR``
before the workers start) and ``/metrics``, whichever worker answers, adds up all of them.

Label values come from the config (public model IDs, upstream names) and from a fixed set of
route names, never from raw client input, so cardinality is bounded.
"""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess
from prometheus_client.exposition import CONTENT_TYPE_LATEST

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, registry: CollectorRegistry | None = None, multiprocess_dir: Path | None = None) -> None:
        self.multiprocess_dir = multiprocess_dir
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "gateway_requests", "Requests by public model, route and status class",
            ["model", "route", "status_class"], registry=r,
        )
        self.latency = Histogram(
            "gateway_request_duration_seconds", "Time until the last byte of the response was sent",
            ["model", "route"], buckets=_LATENCY, registry=r,
        )
        self.ttfb = Histogram(
            "gateway_time_to_first_byte_seconds", "Time until the first byte of the upstream's body",
            ["model", "route"], buckets=_LATENCY, registry=r,
        )
        self.upstream_errors = Counter(
            "gateway_upstream_errors", "Upstream failures by backend and kind", ["backend", "kind"], registry=r,
        )
        self.in_flight = Gauge(
            "gateway_requests_in_flight", "Requests being served", ["route"], registry=r,
            multiprocess_mode="livesum",
        )
        self.upstream_up = Gauge(
            "gateway_upstream_up", "1 when the last probe of the backend succeeded", ["backend", "model"],
            registry=r, multiprocess_mode="livemax",
        )
        self.client_disconnects = Counter(
            "gateway_client_disconnects", "Requests whose client went away before the end",
            ["model", "route"], registry=r,
        )

    def render(self) -> bytes:
        if self.multiprocess_dir is None:
            return generate_latest(self.registry)
        merged = CollectorRegistry()
        multiprocess.MultiProcessCollector(merged, path=str(self.multiprocess_dir))  # type: ignore[no-untyped-call]
        return generate_latest(merged)

    def close(self) -> None:
        """At worker exit: its live gauges (in-flight, up) stop counting."""
        if self.multiprocess_dir is not None:
            multiprocess.mark_process_dead(os.getpid(), str(self.multiprocess_dir))  # type: ignore[no-untyped-call]


def status_class(status: int) -> str:
    return f"{status // 100}xx" if 100 <= status < 600 else "other"
