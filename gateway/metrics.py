"""Every gateway_* metric, in the gateway's own CollectorRegistry. Labels are bounded: route,
pool, backend, engine, outcome and a few fixed enums; a client's model string never becomes one."""

from __future__ import annotations

from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

M = TypeVar("M", Counter, Gauge, Histogram)

UNKNOWN = "__unknown__"
NONE = "none"

OUTCOMES = (
    "success",
    "client_closed",
    "upstream_error_before_first_byte",
    "upstream_error_midstream",
    "timeout_ttfb",
    "timeout_idle",
    "rejected_4xx",
    "overloaded",
)

_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0)
_DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
_TPS_BUCKETS = (1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 15.0, 20.0, 30.0, 50.0, 75.0, 100.0, 150.0, 250.0, 500.0, 1000.0)
_OVERHEAD_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1)
_QUEUE_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

_REQ = ("route", "pool", "backend")


class GatewayMetrics:
    """Owns the registry; one instance per app, so tests build fresh ones and never reset globals."""

    def __init__(self) -> None:
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        r = self.registry = CollectorRegistry(auto_describe=True)
        # The user's lens: one sample per request.
        self.ttft = Histogram(
            "gateway_time_to_first_token_seconds",
            "Time from request arrival to the first content token.",
            _REQ,
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "gateway_inter_token_latency_seconds",
            "Gap between consecutive content chunks of one stream.",
            _REQ,
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self.duration = Histogram(
            "gateway_request_duration_seconds",
            "End-to-end request time as the gateway saw it.",
            _REQ,
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.request_tps = Histogram(
            "gateway_request_output_tokens_per_second",
            "Per-request output tokens / decode time (first to last token).",
            _REQ,
            buckets=_TPS_BUCKETS,
            registry=r,
        )
        # The machine's lens: rate() of the counters is aggregate tok/s; the gauge is concurrency.
        self.output_tokens = Counter(
            "gateway_output_tokens", "Output (completion) tokens relayed.", (*_REQ, "source"), registry=r
        )
        self.prompt_tokens = Counter("gateway_prompt_tokens", "Prompt tokens processed.", (*_REQ, "source"), registry=r)
        self.requests = Counter(
            "gateway_requests", "Requests by their one terminal outcome.", (*_REQ, "outcome"), registry=r
        )
        self.in_flight = Gauge("gateway_requests_in_flight", "Requests being served now.", _REQ, registry=r)
        self.queue_wait = Histogram(
            "gateway_queue_wait_seconds",
            "Time spent waiting for a backend slot.",
            ("route", "pool"),
            buckets=_QUEUE_BUCKETS,
            registry=r,
        )
        # The gateway's own cost.
        self.overhead = Histogram(
            "gateway_overhead_seconds",
            "Time in the gateway before the upstream request is sent.",
            ("route",),
            buckets=_OVERHEAD_BUCKETS,
            registry=r,
        )
        self.relay_seconds = Counter(
            "gateway_relay_overhead_seconds",
            "Time spent in the gateway relaying response chunks.",
            ("route",),
            registry=r,
        )
        self.relay_chunks = Counter("gateway_relay_chunks", "Response chunks relayed.", ("route",), registry=r)
        # Decisions and health.
        self.route_decisions = Counter(
            "gateway_route_decisions", "Routing decisions by pool and rule.", ("route", "pool", "rule"), registry=r
        )
        self.cap_actions = Counter(
            "gateway_context_cap", "Context-cap actions taken.", ("route", "action", "method"), registry=r
        )
        self.truncated_messages = Counter(
            "gateway_truncated_messages", "Messages dropped by truncate_oldest.", ("route",), registry=r
        )
        self.retries = Counter("gateway_retries", "Upstream attempts after the first.", ("route", "pool"), registry=r)
        self.retry_budget_exhausted = Counter(
            "gateway_retry_budget_exhausted",
            "Retries refused because the retry budget was spent.",
            ("route",),
            registry=r,
        )
        self.upstream_errors = Counter(
            "gateway_upstream_errors", "Upstream failures by kind.", ("pool", "backend", "kind"), registry=r
        )
        self.client_disconnects = Counter(
            "gateway_client_disconnects",
            "Clients that left before their answer was complete.",
            (*_REQ, "stage"),
            registry=r,
        )
        self.wasted_tokens = Counter(
            "gateway_disconnect_wasted_tokens", "Output tokens generated for clients that had left.", _REQ, registry=r
        )
        self.backend_up = Gauge(
            "gateway_backend_up", "1 when the backend is healthy.", ("pool", "backend", "engine"), registry=r
        )
        self.backend_load = Gauge(
            "gateway_backend_load",
            "Engine load scraped from the backend's /metrics.",
            ("pool", "backend", "engine", "signal"),
            registry=r,
        )
        self.scrape_age = Gauge(
            "gateway_backend_scrape_age_seconds", "Age of the last good load scrape.", ("pool", "backend"), registry=r
        )

        # Client keys.
        self.rate_limited = Counter(
            "gateway_rate_limited",
            "Requests refused 429 by a client key's own limit (key: its config name).",
            ("key", "limit"),
            registry=r,
        )
        self.limiter_up = Gauge(
            "gateway_limiter_backend_up",
            "1 when the rate-limit counter store (memory or redis) answered its last call.",
            ("store",),
            registry=r,
        )
        self.limiter_errors = Counter(
            "gateway_limiter_errors", "Calls to the rate-limit counter store that failed.", ("store",), registry=r
        )

    def child(self, metric: M, *labels: str) -> M:
        """metric.labels(*labels), memoised: labels() takes a lock and validates on every call, and
        the hot path asks for the same few children again and again. Bounded, as the labels are."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found
