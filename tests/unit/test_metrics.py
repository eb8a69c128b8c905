"""The fine per-request histograms: log-spaced bounds, a bisecting observe() that counts exactly as
prometheus_client's own, and a fast exposition that writes the same lines as generate_latest."""

from __future__ import annotations

import itertools
import math

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gateway.metric_types import FineHistogram, LeanCounter, LeanGauge, LeanHistogram, log_buckets
from gateway.metrics import _TTFT_BUCKETS, GatewayMetrics


def test_log_buckets_are_about_two_percent_apart_and_hit_the_decades() -> None:
    bounds = log_buckets(0.01, 10.0, 120)
    assert bounds[0] == 0.01 and bounds[-1] == 10.0 and 0.1 in bounds and 1.0 in bounds
    ratios = [b / a for a, b in itertools.pairwise(bounds)]
    assert len(bounds) == 361
    assert all(1.0185 < r < 1.0205 for r in ratios)
    assert list(_TTFT_BUCKETS) == sorted(set(_TTFT_BUCKETS))


def test_fine_histogram_counts_like_prometheus_client() -> None:
    bounds = (0.1, 0.2, 0.5, 1.0)
    values = [0.0, 0.1, 0.1000001, 0.2, 0.35, 0.5, 0.99, 1.0, 1.5, math.inf, -1.0]
    registries = []
    for cls in (Histogram, LeanHistogram, FineHistogram):
        registry = CollectorRegistry()
        h = cls("x_seconds", "x", ("a",), buckets=bounds, registry=registry).labels("y")
        for v in values:
            h.observe(v)
        registries.append(registry)
    samples = [
        [(s.name, s.labels, s.value) for f in r.collect() for s in f.samples if not s.name.endswith("_created")]
        for r in registries
    ]
    assert samples[0] == samples[1] == samples[2]


def test_exposition_writes_the_lines_generate_latest_writes() -> None:
    m = GatewayMetrics()
    for route, pool in (("chat", "vllm"), ("chat", "sglang"), ('odd "name" \\ here', "b")):
        for h in (m.ttft, m.itl, m.duration, m.request_tps):
            m.child(h, route, pool, "chat").observe(0.1234)
            m.child(h, route, pool, "chat").observe(7.0)
    m.child(m.requests, "chat", "pool", "vllm-0", "chat", "success").inc()
    m.child(m.overhead, "chat").observe(0.001)
    slow = generate_latest(m.registry).decode().splitlines()
    fast = m.exposition().decode().splitlines()
    assert sorted(fast) == sorted(slow)
    assert 'gateway_time_to_first_token_seconds_bucket{api="chat",le="0.1235",pool="vllm",route="chat"} 1.0' in fast


def test_lean_counter_and_gauge_expose_what_prometheus_client_does() -> None:
    pages = []
    for counter, gauge in ((Counter, Gauge), (LeanCounter, LeanGauge)):
        registry = CollectorRegistry()
        c = counter("x", "x", ("a",), registry=registry)
        g = gauge("y", "y", ("a",), registry=registry)
        c.labels("p").inc()
        c.labels("p").inc(2.5)
        c.labels("q").inc(0)
        g.labels("p").inc(3)
        g.labels("p").dec()
        g.labels("q").set(7)
        page = generate_latest(registry).decode().splitlines()
        pages.append([line for line in page if "_created" not in line])
    assert pages[0] == pages[1]
    assert 'x_total{a="p"} 3.5' in pages[1] and 'y{a="p"} 2.0' in pages[1]


def test_request_series_updates_the_labelled_samples_and_adds_none_unused() -> None:
    m = GatewayMetrics()
    s = m.series("chat", "vllm", "vllm-0", "chat")
    assert m.series("chat", "vllm", "vllm-0", "chat") is s
    assert "gateway_requests_total{" not in m.exposition().decode()  # nothing used yet: no sample
    s.outcome("success").inc(1)
    s.outcome("success").inc(1)
    s.tokens("output", "usage").inc(12)
    s.tokens("prompt", "estimated").inc(30)
    s.in_flight().inc(1)
    s.fine(m.ttft).observe(0.25)
    page = m.exposition().decode()
    labels = 'api="chat",backend="vllm-0"'
    assert f'gateway_requests_total{{{labels},outcome="success",pool="vllm",route="chat"}} 2.0' in page
    assert f'gateway_output_tokens_total{{{labels},pool="vllm",route="chat",source="usage"}} 12.0' in page
    assert f'gateway_prompt_tokens_total{{{labels},pool="vllm",route="chat",source="estimated"}} 30.0' in page
    assert 'gateway_requests_in_flight{backend="vllm-0",pool="vllm",route="chat"} 1.0' in page
    assert 'gateway_time_to_first_token_seconds_count{api="chat",pool="vllm",route="chat"} 1.0' in page
    assert "gateway_request_output_tokens_per_second_count" not in page  # never observed: not made
    assert 'outcome="client_closed"' not in page


def test_openmetrics_exposition_writes_what_prometheus_client_writes_with_exemplars() -> None:
    """The OpenMetrics page (tracing on, a scrape that asks for it) is prometheus_client's own
    OpenMetrics generate_latest, line for line, each bucket's exemplar (a trace id) included."""
    from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    m = GatewayMetrics()
    trace = {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"}
    for route, pool in (("chat", "vllm"), ('odd "name" \\ here', "b")):
        m.child(m.duration, route, pool, "chat").observe(0.1234, trace)
        m.child(m.duration, route, pool, "chat").observe(7.0)
        m.child(m.ttft, route, pool, "chat").observe(0.05, {"trace_id": "00f067aa0ba902b7" * 2})
    m.child(m.overhead, "chat").observe(0.001, trace)
    m.child(m.requests, "chat", "pool", "vllm-0", "chat", "success").inc()
    slow = openmetrics_latest(m.registry).decode()  # type: ignore[no-untyped-call]
    fast = b"".join(m.exposition_parts(openmetrics=True)).decode()
    assert fast.endswith("# EOF\n") and fast.count("# EOF") == 1
    assert sorted(fast.splitlines()) == sorted(slow.splitlines())
    found = [
        (s.labels, s.exemplar.labels)
        for family in text_string_to_metric_families(fast)  # type: ignore[no-untyped-call]
        for s in family.samples
        if s.exemplar is not None and s.name == "gateway_request_duration_seconds_bucket"
    ]
    assert len(found) == 2 and all(ex == trace for _, ex in found)
    assert "# {" not in m.exposition().decode()  # the text format has no exemplars
