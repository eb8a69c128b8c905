"""Every gateway_* metric, in the gateway's own CollectorRegistry. Labels are bounded: route,
pool, backend, engine, outcome and a few fixed enums; a client's model string never becomes one
(gateway_backend_model_info's `model` is what an engine serves, at most 32 a backend)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Literal, TypeVar, cast, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics_exposition
from prometheus_client.registry import Collector

from gateway.metric_types import (
    FineHistogram,
    LeanCounter,
    LeanGauge,
    LeanHistogram,
    PlainValue,
    log_buckets,
    value_of,
)

M = TypeVar("M", Counter, Gauge, Histogram)
C = TypeVar("C", bound=Collector)
_openmetrics_latest = cast(Callable[[CollectorRegistry], bytes], openmetrics_exposition.generate_latest)  # typed alias


UNKNOWN = "__unknown__"
NONE = "none"

Outcome = Literal[
    "success",
    "client_closed",
    "upstream_error_before_first_byte",
    "upstream_error_midstream",
    "timeout_ttfb",
    "timeout_idle",
    "rejected_4xx",
    "overloaded",
    "internal_error",
]
"""How a request ended: exactly one per request (the Exchange record's outcome, a metric label)."""

OUTCOMES: tuple[str, ...] = get_args(Outcome)


# The user's lens is read as quantiles, and histogram_quantile interpolates linearly inside a
# bucket: with bounds a ratio r apart its error is at most about (r - 1) / 2 at the median and
# (r - 1) at p95 for values bunched inside one bucket, far less for spread ones. 120 per decade is
# r = 1.0194, so every quantile is within 1-2 % over the range that matters; a few coarse bounds
# catch the rest. Costs and measurements: docs/metrics.md, "Quantiles within 2 %".
FINE_PER_DECADE = 120
_TTFT_BUCKETS = (0.001, 0.0025, *log_buckets(0.005, 20.0, FINE_PER_DECADE), 30.0, 60.0, 120.0)
_ITL_BUCKETS = (0.0005, *log_buckets(0.001, 1.0, FINE_PER_DECADE), 2.0, 5.0)
_DURATION_BUCKETS = (0.005, 0.01, *log_buckets(0.02, 300.0, FINE_PER_DECADE), 600.0, 1200.0)
_TPS_BUCKETS = (0.25, 0.5, *log_buckets(1.0, 1000.0, FINE_PER_DECADE), 2000.0, 5000.0)
_OVERHEAD_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1)
_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_QUEUE_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

_REQ = ("route", "pool", "backend")
# The fine per-request histograms (1,685 series a label set) drop `backend`: their cost then follows
# the config's routes x pools, not the number of engine replicas DNS discovery finds.
_FINE = ("route", "pool", "api")


class GatewayMetrics:
    """Owns the registry; one instance per app, so tests build fresh ones and never reset globals."""

    def __init__(self) -> None:
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._series: dict[tuple[str, str, str, str], RequestSeries] = {}
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.features: dict[str, Any] = {}
        """Collectors a feature registers once on this registry and re-points at each reload's
        gateway (fleet/kvevents/fleet.py's KVEventCollector), by feature name."""
        # The user's lens: one sample per request.
        self.ttft = FineHistogram(
            "gateway_time_to_first_token_seconds",
            "Time from request arrival to the first content token.",
            _FINE,
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.itl = FineHistogram(
            "gateway_inter_token_latency_seconds",
            "Gap between consecutive content events of one stream, as they arrive from the upstream "
            "(events that arrive in one read are 0 s apart).",
            _FINE,
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self.duration = FineHistogram(
            "gateway_request_duration_seconds",
            "End-to-end request time as the gateway saw it.",
            _FINE,
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.request_tps = FineHistogram(
            "gateway_request_output_tokens_per_second",
            "Per-request output tokens / decode time (first to last token).",
            _FINE,
            buckets=_TPS_BUCKETS,
            registry=r,
        )
        # The machine's lens: rate() of the counters is aggregate tok/s; the gauge is concurrency.
        self.output_tokens = LeanCounter(
            "gateway_output_tokens", "Output (completion) tokens relayed.", (*_REQ, "api", "source"), registry=r
        )
        self.prompt_tokens = LeanCounter(
            "gateway_prompt_tokens", "Prompt tokens processed.", (*_REQ, "api", "source"), registry=r
        )
        self.requests = LeanCounter(
            "gateway_requests", "Requests by their one terminal outcome.", (*_REQ, "api", "outcome"), registry=r
        )
        self.in_flight = LeanGauge("gateway_requests_in_flight", "Requests being served now.", _REQ, registry=r)
        self.queue_wait = LeanHistogram(
            "gateway_queue_wait_seconds",
            "Time spent waiting for a backend slot.",
            ("route", "pool"),
            buckets=_QUEUE_BUCKETS,
            registry=r,
        )
        self.class_queue_wait = LeanHistogram(
            "gateway_class_queue_wait_seconds",
            "Time spent waiting for a backend slot, by pool, priority class and client key (its config name).",
            ("pool", "priority", "key"),
            buckets=_QUEUE_BUCKETS,
            registry=r,
        )
        self.shed = LeanCounter(
            "gateway_shed_requests",
            "Requests refused 429 by a saturated pool, by priority class and why (full, timeout, shed).",
            ("pool", "priority", "reason"),
            registry=r,
        )
        # The gateway's own cost.
        self.overhead = LeanHistogram(
            "gateway_overhead_seconds",
            "Time in the gateway before the upstream request is sent.",
            ("route",),
            buckets=_OVERHEAD_BUCKETS,
            registry=r,
        )
        self.relay_seconds = LeanCounter(
            "gateway_relay_overhead_seconds",
            "Time spent in the gateway relaying response chunks.",
            ("route",),
            registry=r,
        )
        self.relay_chunks = LeanCounter("gateway_relay_chunks", "Response chunks relayed.", ("route",), registry=r)
        # Decisions and health.
        self.route_decisions = LeanCounter(
            "gateway_route_decisions", "Routing decisions by pool and rule.", ("route", "pool", "rule"), registry=r
        )
        self.cap_actions = LeanCounter(
            "gateway_context_cap", "Context-cap actions taken.", ("route", "action", "method"), registry=r
        )
        self.dropped_features = LeanCounter(
            "gateway_dropped_features",
            "Request features a translation to chat completions left out (x-gateway-dropped), by name.",
            ("route", "api", "feature"),
            registry=r,
        )
        self.truncated_messages = LeanCounter(
            "gateway_truncated_messages", "Messages dropped by truncate_oldest.", ("route",), registry=r
        )
        self.retries = LeanCounter(
            "gateway_retries", "Upstream attempts after the first.", ("route", "pool"), registry=r
        )
        self.retry_budget_exhausted = LeanCounter(
            "gateway_retry_budget_exhausted",
            "Retries refused because the retry budget was spent.",
            ("route",),
            registry=r,
        )
        self.upstream_errors = LeanCounter(
            "gateway_upstream_errors", "Upstream failures by kind.", ("pool", "backend", "kind"), registry=r
        )
        self.client_disconnects = LeanCounter(
            "gateway_client_disconnects",
            "Clients that left before their answer was complete.",
            (*_REQ, "api", "stage"),
            registry=r,
        )
        self.kv_predicted_tokens = LeanCounter(
            "gateway_kv_events_predicted_cached_tokens",
            "kv_events: prompt tokens the backend's KV events said it held when the request was routed "
            "(answers that report cached_tokens only).",
            ("pool", "backend"),
            registry=r,
        )
        self.kv_served_tokens = LeanCounter(
            "gateway_kv_events_served_cached_tokens",
            "kv_events: prompt tokens the engine reports it served from its prefix cache, for the same answers.",
            ("pool", "backend"),
            registry=r,
        )
        self.kv_predictions = LeanCounter(
            "gateway_kv_events_predictions",
            "kv_events: answers by how the prediction compared with the engine's cached_tokens "
            "(exact, over: predicted more, under).",
            ("pool", "backend", "verdict"),
            registry=r,
        )
        self.kv_prompt_ids = LeanCounter(
            "gateway_kv_events_prompt_ids",
            "kv_events: where a request's token ids for the cache match came from (remembered: its own; "
            "local: its own, from the pool's tokenizer; resumed: the same, encoded from an earlier turn's ids; "
            "prefix: an earlier turn's or its system messages'; none: routed with no match; mismatch: the pool's "
            "tokenizer disagreed with the engine and was turned off; resume_mismatch: encoding from an earlier "
            "turn's ids disagreed with encoding whole and was turned off).",
            ("source",),
            registry=r,
        )
        self.wasted_tokens = LeanCounter(
            "gateway_disconnect_wasted_tokens", "Output tokens generated for clients that had left.", _REQ, registry=r
        )
        self.backend_up = LeanGauge(
            "gateway_backend_up", "1 when the backend is healthy.", ("pool", "backend", "engine"), registry=r
        )
        self.backend_model = LeanGauge(
            "gateway_backend_model_info",
            "A model the backend serves (its config `model:`, else what its /v1/models lists, at most 32 "
            "a backend); the value is its context window in tokens, 0 when unknown.",
            ("pool", "backend", "model"),
            registry=r,
        )
        self.backend_load = LeanGauge(
            "gateway_backend_load",
            "Engine load scraped from the backend's /metrics.",
            ("pool", "backend", "engine", "signal"),
            registry=r,
        )
        self.scrape_age = LeanGauge(
            "gateway_backend_scrape_age_seconds", "Age of the last good load scrape.", ("pool", "backend"), registry=r
        )
        self.pool_endpoints = LeanGauge(
            "gateway_inference_pool_endpoints",
            "Endpoints (ready pod IP x target port) an InferencePool lists now, as last applied.",
            ("pool", "inference_pool"),
            registry=r,
        )
        self.pool_watch_restarts = LeanCounter(
            "gateway_inference_pool_watch_restarts",
            "Times the InferencePool's pod watch started again (reason: ended, expired, error).",
            ("pool", "inference_pool", "reason"),
            registry=r,
        )
        # Client keys.
        self.rate_limited = LeanCounter(
            "gateway_rate_limited",
            "Requests refused 429 by a client key's own limit (key: its config name).",
            ("key", "limit"),
            registry=r,
        )
        self.budget_used = LeanGauge(
            "gateway_budget_used_tokens",
            "Tokens a client key has used of its budget this period (period: day or month; kind: input or"
            " output), as the counter store had it when the key's last request ended.",
            ("key", "period", "kind"),
            registry=r,
        )
        self.limiter_up = LeanGauge(
            "gateway_limiter_backend_up",
            "1 when the rate-limit counter store (memory or redis) answered its last call.",
            ("store",),
            registry=r,
        )
        self.limiter_errors = LeanCounter(
            "gateway_limiter_errors", "Calls to the rate-limit counter store that failed.", ("store",), registry=r
        )
        self.loop_lag = LeanHistogram(
            "gateway_event_loop_lag_seconds",
            "How late the gateway's event loop ran a timer due every 100 ms: the wait that every request"
            " on this process saw at that moment, before any of its own work.",
            buckets=_LAG_BUCKETS,
            registry=r,
        )
        # The same metrics for exposition(): the coarse ones in a registry of their own.
        made = [
            *(self.ttft, self.itl, self.duration, self.request_tps),
            *(self.output_tokens, self.prompt_tokens, self.requests, self.in_flight, self.queue_wait),
            *(self.overhead, self.relay_seconds, self.relay_chunks, self.route_decisions, self.cap_actions),
            *(
                self.dropped_features,
                self.truncated_messages,
                self.retries,
                self.retry_budget_exhausted,
                self.upstream_errors,
            ),
            *(self.client_disconnects, self.wasted_tokens, self.backend_up, self.backend_model),
            *(self.kv_predicted_tokens, self.kv_served_tokens, self.kv_predictions, self.kv_prompt_ids),
            *(self.backend_load, self.scrape_age, self.rate_limited, self.limiter_up, self.limiter_errors),
            *(self.class_queue_wait, self.shed, self.budget_used, self.loop_lag),
            *(self.pool_endpoints, self.pool_watch_restarts),
        ]
        self._fine = [m for m in made if isinstance(m, FineHistogram)]
        self._coarse = CollectorRegistry(auto_describe=True)
        for m in made:
            if not isinstance(m, FineHistogram):
                self._coarse.register(m)
        self._render_cache: dict[str, dict[tuple[str, ...], list[str]]] = {}

    def feature(self, name: str, make: Callable[[], C]) -> C:
        """The collector a feature keeps on this registry under `name`, made and registered on
        first use: in the registry and in /metrics' own (exposition())."""
        found = self.features.get(name)
        if found is None:
            found = self.features[name] = make()
            self.registry.register(found)
            self._coarse.register(found)
        return cast(C, found)

    def exposition(self) -> bytes:
        """The /metrics page: generate_latest for every metric but the fine histograms, which
        render themselves (see FineHistogram.render); the same lines, in another order."""
        return b"".join(self.exposition_parts())

    def exposition_parts(self, openmetrics: bool = False) -> Iterator[bytes]:
        """exposition() in pieces of ~1 ms of CPU each (the coarse metrics, then one fine histogram
        at a time), so that /metrics can let the event loop run between them. `openmetrics`: the
        OpenMetrics format, which carries the histograms' exemplars (trace ids)."""
        if not openmetrics:
            yield generate_latest(self._coarse)
        else:
            yield _openmetrics_latest(self._coarse).removesuffix(b"# EOF\n")
        for h in self._fine:
            yield h.render(self._render_cache.setdefault(h._name, {}), openmetrics).encode()
        if openmetrics:
            yield b"# EOF\n"

    def series(self, route: str, pool: str, backend: str, api: str) -> RequestSeries:
        """The samples of one request's labels, memoised (bounded, as the labels are)."""
        key = (route, pool, backend, api)
        found = self._series.get(key)
        if found is None:
            found = self._series[key] = RequestSeries(self, route, pool, backend, api)
        return found

    def child(self, metric: M, *labels: str) -> M:
        """metric.labels(*labels), memoised: labels() takes a lock and validates on every call, and
        the hot path asks for the same few children again and again. Bounded, as the labels are."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return cast(M, found)


class RequestSeries:
    """The samples one request's labels (route, pool, backend, api) touch, found once: the
    accounting updates them with no label lookup and no lock (GatewayMetrics.series memoises one
    a label set). A child is made on its first use, so that a series appears on /metrics only once
    it has something to say, as with labels()."""

    __slots__ = ("_fine", "_in_flight", "_labels", "_m", "_outcomes", "_tokens")

    def __init__(self, m: GatewayMetrics, route: str, pool: str, backend: str, api: str) -> None:
        self._m = m
        self._labels = (route, pool, backend, api)
        self._fine = (route, pool, api)
        self._outcomes: dict[str, PlainValue] = {}
        self._tokens: dict[tuple[str, str], PlainValue] = {}
        self._in_flight: PlainValue | None = None

    def in_flight(self) -> PlainValue:
        """gateway_requests_in_flight (route, pool, backend)."""
        found = self._in_flight
        if found is None:
            m = self._m
            found = self._in_flight = value_of(m.child(m.in_flight, *self._labels[:3]))
        return found

    def outcome(self, outcome: str) -> PlainValue:
        """gateway_requests_total for this outcome."""
        found = self._outcomes.get(outcome)
        if found is None:
            m = self._m
            found = self._outcomes[outcome] = value_of(m.child(m.requests, *self._labels, outcome))
        return found

    def tokens(self, kind: Literal["output", "prompt"], source: str) -> PlainValue:
        """gateway_output_tokens_total or gateway_prompt_tokens_total from this source."""
        found = self._tokens.get((kind, source))
        if found is None:
            m = self._m
            metric = m.output_tokens if kind == "output" else m.prompt_tokens
            found = self._tokens[(kind, source)] = value_of(m.child(metric, *self._labels, source))
        return found

    def fine(self, metric: FineHistogram) -> FineHistogram:
        """One of the fine per-request histograms (no backend label), for these labels."""
        return cast(FineHistogram, self._m.child(metric, *self._fine))
