"""Prometheus metrics of the server: request counts, tokens, latencies, and the engine's state
read at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)

# (metric name, help, key in the engine's stats()).
_ENGINE_GAUGES = (
    ("tallow_kv_pages_used", "KV cache pages in use", "pages_used"),
    ("tallow_kv_pages_total", "KV cache pages in the pool", "pages_total"),
    ("tallow_kv_utilization", "Tokens stored over the slots of the pages in use", "utilization"),
    ("tallow_requests_running", "Requests being generated", "running"),
    ("tallow_requests_waiting", "Requests queued for the engine", "waiting"),
    ("tallow_prefix_cache_pages", "KV pages in the prefix cache (in use or free)", "cached_pages"),
    (
        "tallow_tokens_per_second",
        "Tokens computed per second over the last steps",
        "tokens_per_second",
    ),
)


# Counters: (metric name without _total, help, key in the engine's stats()).
_ENGINE_COUNTERS = (
    ("tallow_preemptions", "Requests preempted (their KV recomputed later)", "preemptions"),
    (
        "tallow_prefix_cache_queried_tokens",
        "Prompt tokens looked up in the prefix cache",
        "prefix_queried_tokens",
    ),
    (
        "tallow_prefix_cache_hit_tokens",
        "Prompt tokens found in the prefix cache",
        "prefix_hit_tokens",
    ),
    (
        "tallow_prefix_cache_evicted_pages",
        "Cached KV pages reused for other content",
        "evicted_pages",
    ),
)


class _EngineCollector(Collector):
    def __init__(self, stats: Callable[[], dict[str, float]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        stats = self._stats()
        for name, doc, key in _ENGINE_GAUGES:
            yield GaugeMetricFamily(name, doc, value=float(stats.get(key, 0.0)))
        for name, doc, key in _ENGINE_COUNTERS:
            yield CounterMetricFamily(name, doc, value=float(stats.get(key, 0.0)))


class Metrics:
    """The server's metrics in a registry of their own."""

    def __init__(self, engine_stats: Callable[[], dict[str, float]]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "tallow_requests",
            "Requests answered, by endpoint and status",
            ["endpoint", "status"],
            registry=r,
        )
        self.prompt_tokens = Counter("tallow_prompt_tokens", "Prompt tokens processed", registry=r)
        self.generation_tokens = Counter("tallow_generation_tokens", "Tokens generated", registry=r)
        self.time_to_first_token = Histogram(
            "tallow_time_to_first_token_seconds",
            "Time from a request's arrival to its first generated token",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.inter_token_latency = Histogram(
            "tallow_inter_token_latency_seconds",
            "Time between consecutive generated tokens of a request",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.request_duration = Histogram(
            "tallow_request_duration_seconds",
            "Time from a request's arrival to its last token",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        r.register(_EngineCollector(engine_stats))

    def render(self) -> bytes:
        return generate_latest(self.registry)
