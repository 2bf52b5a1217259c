"""The router's Prometheus metrics (`GET /metrics`), in a registry of its own.

Engines are labelled by phase, island and index within the island, never by URL: the metrics name no
host.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

OUTCOMES = ("ok", "engine_status", "bad_request", "unavailable", "shed", "timeout", "engine_error", "error")
BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)


class Metrics:
    def __init__(self, names: dict[str, tuple[str, str, int]]) -> None:
        self.registry = CollectorRegistry()
        self.names = names
        self._requests = Counter("archipelago_router_requests", "Requests answered, by outcome", ["outcome"],
                                 registry=self.registry)  # fmt: skip
        self._by_outcome = {o: self._requests.labels(o) for o in OUTCOMES}
        self._latency = Histogram("archipelago_router_request_seconds", "Time from a request to its answer's end",
                                  buckets=BUCKETS, registry=self.registry)  # fmt: skip
        self._retries = Counter("archipelago_router_retries", "Requests sent again to another engine",
                                registry=self.registry)  # fmt: skip
        self._errors = Counter("archipelago_router_engine_errors", "Engine connections failed or timed out",
                               ["phase", "island", "engine", "kind"], registry=self.registry)  # fmt: skip
        self._up = Gauge("archipelago_router_engine_up", "1 when the engine answers its health check",
                         ["phase", "island", "engine"], registry=self.registry)  # fmt: skip
        self._in_flight = Gauge("archipelago_router_in_flight", "Requests being served", registry=self.registry)
        for url in names:
            self.engine_up(url, True)

    def _labels(self, url: str) -> tuple[str, str, str]:
        phase, island, j = self.names[url]
        return phase, island, str(j)

    def answered(self, outcome: str, seconds: float | None = None) -> None:
        self._by_outcome[outcome].inc()
        if seconds is not None:
            self._latency.observe(seconds)

    def retried(self) -> None:
        self._retries.inc()

    def upstream_error(self, url: str, timed_out: bool) -> None:
        self._errors.labels(*self._labels(url), "timeout" if timed_out else "connection").inc()

    def engine_up(self, url: str, up: bool) -> None:
        self._up.labels(*self._labels(url)).set(1 if up else 0)

    def render(self, in_flight: int) -> bytes:
        self._in_flight.set(in_flight)
        return generate_latest(self.registry)
