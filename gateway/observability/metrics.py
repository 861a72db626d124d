"""Prometheus metrics on a registry of the app's own (two apps can live in one process).

With several worker processes (``gateway serve --workers N``) every worker writes its values to files
in one directory (prometheus_client's multiprocess mode, switched on by ``PROMETHEUS_MULTIPROC_DIR``
before the workers start) and ``/metrics``, whichever worker answers, adds up all of them.

Label values come from the config (public model IDs, upstream names) and from a fixed set of
route names, never from raw client input, so cardinality is bounded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess
from prometheus_client.exposition import CONTENT_TYPE_LATEST


@dataclass(slots=True)
class RequestSeries:
    """The bound series of one (public model, route): looked up once, then used on every request
    (``labels()`` validates and locks on each call; a dict lookup here does not)."""

    latency: Any
    ttfb: Any
    requests: Any  # the Counter, for status classes not bound yet
    model: str
    route: str
    by_class: dict[str, Any] = field(default_factory=dict)

    def count(self, status_class: str) -> None:
        child = self.by_class.get(status_class)
        if child is None:
            child = self.by_class[status_class] = self.requests.labels(self.model, self.route, status_class)
        child.inc()


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
        self.upstream_client_errors = Counter(
            "gateway_upstream_client_errors",
            "Requests a backend refused as the client's mistake (its 4xx: bad parameters, prompt too long)",
            ["backend", "kind"], registry=r,
        )
        self.client_stalls = Counter(
            "gateway_client_stalls",
            "Streams cut because the client stopped reading for longer than timeouts.client_stall",
            ["model", "route"], registry=r,
        )
        self.in_flight = Gauge(
            "gateway_requests_in_flight", "Requests being served", ["route"], registry=r,
            multiprocess_mode="livesum",
        )
        self.upstream_up = Gauge(
            "gateway_upstream_up", "1 when the last probe of the backend succeeded", ["backend", "model"],
            registry=r, multiprocess_mode="livemax",
        )
        self.upstream_circuit_state = Gauge(
            "gateway_upstream_circuit_state",
            "The backend's circuit breaker: 0 closed (traffic flows), 1 half-open (one trial request), "
            "2 open (no traffic)", ["upstream"], registry=r, multiprocess_mode="livemax",
        )
        self.retries = Counter(
            "gateway_retries", "Attempts sent again before the first byte reached the client, by public "
            "model and reason (connect, reset, http_<status>)", ["model", "reason"], registry=r,
        )
        self.fallbacks = Counter(
            "gateway_fallbacks", "Requests served by a fallback model because no upstream of the requested "
            "one could take them", ["from_model", "to_model"], registry=r,
        )
        self.client_disconnects = Counter(
            "gateway_client_disconnects", "Requests whose client went away before the end",
            ["model", "route"], registry=r,
        )
        self.tokens = Counter(
            "gateway_tokens", "Tokens used (real usage from the backend) by key, public model and kind "
            "(prompt, completion)", ["key", "model", "kind"], registry=r,
        )
        self.rate_limited = Counter(
            "gateway_rate_limited", "Requests refused by a rate limit, by key and kind (requests, tokens, "
            "parallel)", ["key", "kind"], registry=r,
        )
        self.rate_limiter_errors = Counter(
            "gateway_rate_limiter_errors", "Rate-limiter store (Redis) calls that failed or timed out",
            registry=r,
        )

        self.config_version = Gauge(
            "gateway_config_version", "Version of the admin overlay this instance serves (0: none)",
            registry=r, multiprocess_mode="livemax",
        )
        # Load routing (docs/routing.md): label `backend` is an upstream name from the config.
        self.upstream_in_flight = Gauge(
            "gateway_upstream_in_flight", "This gateway's requests being served by the backend (attempt "
            "sent, response not ended)", ["backend"], registry=r, multiprocess_mode="livesum",
        )
        self.upstream_waiting = Gauge(
            "gateway_upstream_requests_waiting", "vllm:num_requests_waiting at the backend's last scrape",
            ["backend"], registry=r, multiprocess_mode="livemax",
        )
        self.upstream_running = Gauge(
            "gateway_upstream_requests_running", "vllm:num_requests_running at the backend's last scrape",
            ["backend"], registry=r, multiprocess_mode="livemax",
        )
        self.upstream_kv_usage = Gauge(
            "gateway_upstream_kv_cache_usage", "vllm:kv_cache_usage_perc (0..1) at the backend's last scrape",
            ["backend"], registry=r, multiprocess_mode="livemax",
        )
        self.upstream_metrics_ok = Gauge(
            "gateway_upstream_metrics_ok", "1 when the backend's last /metrics scrape succeeded (0: it counts "
            "as saturated)", ["backend"], registry=r, multiprocess_mode="livemin",
        )
        self.shed = Counter(
            "gateway_shed", "Requests refused with 503 model_overloaded (every backend over its shed "
            "thresholds), by public model", ["model"], registry=r,
        )
        self._series: dict[tuple[str, str], RequestSeries] = {}
        self._in_flight: dict[str, Any] = {}
        self._tokens: dict[tuple[str, str], tuple[Any, Any]] = {}
        self._upstream_in_flight: dict[str, Any] = {}

    def series(self, model: str, route: str) -> RequestSeries:
        """The request series of ``(model, route)``, bound once (both are config values or route names)."""
        got = self._series.get((model, route))
        if got is None:
            got = self._series[(model, route)] = RequestSeries(
                self.latency.labels(model, route), self.ttfb.labels(model, route), self.requests, model, route)
        return got

    def count_tokens(self, key: str, model: str, prompt: int, completion: int) -> None:
        """Add a request's usage to ``gateway_tokens`` (the pair of series bound once per key and model)."""
        pair = self._tokens.get((key, model))
        if pair is None:
            pair = self._tokens[(key, model)] = (self.tokens.labels(key, model, "prompt"),
                                                 self.tokens.labels(key, model, "completion"))
        pair[0].inc(prompt)
        pair[1].inc(completion)

    def in_flight_of(self, route: str) -> Any:
        """The in-flight gauge of ``route``, bound once."""
        got = self._in_flight.get(route)
        if got is None:
            got = self._in_flight[route] = self.in_flight.labels(route)
        return got

    def set_upstream_in_flight(self, backend: str, n: int) -> None:
        got = self._upstream_in_flight.get(backend)
        if got is None:
            got = self._upstream_in_flight[backend] = self.upstream_in_flight.labels(backend)
        got.set(n)

    def forget_upstream(self, name: str) -> None:
        """Remove every series of a backend that left the mapping."""
        for metric in (self.upstream_up, self.upstream_errors, self.upstream_client_errors):
            for labels in list(metric._metrics):  # prometheus_client keeps children by label values
                if labels and labels[0] == name:
                    metric.remove(*labels)
        self.forget_backends([name])

    def forget_backends(self, names: list[str]) -> None:
        """Drop the per-backend load gauges of upstreams removed at run time."""
        for g in (self.upstream_in_flight, self.upstream_waiting, self.upstream_running,
                  self.upstream_kv_usage, self.upstream_metrics_ok):
            for n in names:
                self._upstream_in_flight.pop(n, None)
                try:
                    g.remove(n)
                except KeyError:
                    pass

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
