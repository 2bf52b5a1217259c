"""The router's Prometheus metrics (`GET /metrics`), in a registry of its own.

Engines are labelled by phase, island and index within the island, never by URL: the metrics name no
host. Whether each engine is up is read from the router's set of engines down when /metrics is asked
(no per-engine object is kept for it: a plan of 100,000 engines costs no 100,000 gauges).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

OUTCOMES = ("ok", "engine_status", "bad_request", "client_timeout", "unavailable", "shed", "timeout", "engine_error",
            "error")  # fmt: skip
BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)


class _EngineUp:
    """`archipelago_router_engine_up`, computed from the engines down when it is collected."""

    def __init__(self, names: dict[str, tuple[str, str, int]], down: Collection[str]) -> None:
        self.names, self.down = names, down

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily("archipelago_router_engine_up", "1 when the engine answers its health check",
                                 labels=["phase", "island", "engine"])  # fmt: skip

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for url, (phase, island, j) in self.names.items():
            family.add_metric([phase, island, str(j)], 0.0 if url in self.down else 1.0)
        yield family


class Metrics:
    def __init__(self, names: dict[str, tuple[str, str, int]], down: Collection[str]) -> None:
        """`down`: the router's engines down, read when the metrics are collected."""
        self.registry = CollectorRegistry()
        self.names = names
        self._requests = Counter("archipelago_router_requests", "Requests answered, by outcome", ["outcome"],
                                 registry=self.registry)  # fmt: skip
        self._by_outcome = {o: self._requests.labels(o) for o in OUTCOMES}
        self._latency = Histogram("archipelago_router_request_seconds", "Time from a request to its answer's end",
                                  buckets=BUCKETS, registry=self.registry)  # fmt: skip
        self._retries = Counter("archipelago_router_retries", "Requests sent again to another engine",
                                registry=self.registry)  # fmt: skip
        self._errors = Counter("archipelago_router_engine_errors", "Engine answers failed: kind connection, timeout "
                               "or malformed; stage before_answer (the client got a 502 or 504) or mid_answer (the "
                               "client's answer was cut)", ["phase", "island", "engine", "kind", "stage"],
                               registry=self.registry)  # fmt: skip
        self.registry.register(_EngineUp(names, down))  # type: ignore[arg-type]
        self._in_flight = Gauge("archipelago_router_in_flight", "Requests being served", registry=self.registry)
        self._connections = Gauge("archipelago_router_client_connections", "Client connections open, by state",
                                  ["state"], registry=self.registry)  # fmt: skip
        self._evicted = Counter("archipelago_router_idle_connections_closed", "Idle client connections closed to "
                                "keep the connections within --max-connections (idle longest first)",
                                registry=self.registry)  # fmt: skip
        self._evicted_seen = 0

    def _labels(self, url: str) -> tuple[str, str, str]:
        phase, island, j = self.names[url]
        return phase, island, str(j)

    def answered(self, outcome: str, seconds: float | None = None) -> None:
        self._by_outcome[outcome].inc()
        if seconds is not None:
            self._latency.observe(seconds)

    def retried(self) -> None:
        self._retries.inc()

    def upstream_error(self, url: str, kind: str, mid_answer: bool = False) -> None:
        self._errors.labels(*self._labels(url), kind, "mid_answer" if mid_answer else "before_answer").inc()

    def render(self, in_flight: int, connections: tuple[int, int, int] = (0, 0, 0)) -> bytes:
        """The metrics' text; `connections`: client connections open, of them idle, and idle ones closed to keep
        within the cap so far."""
        self._in_flight.set(in_flight)
        open_, idle, evicted = connections
        self._connections.labels("idle").set(idle)
        self._connections.labels("busy").set(open_ - idle)
        self._evicted.inc(evicted - self._evicted_seen)
        self._evicted_seen = evicted
        return generate_latest(self.registry)
