"""The finish step's accounting and the silent-truncation check."""

from __future__ import annotations

import random

import pytest

from gateway.metrics import GatewayMetrics
from gateway.pipeline.accounting import Accounting
from gateway.pipeline.exchange import Exchange
from gateway.policy.caps import engine_truncated
from gateway.protocols.sse import StreamObserver

pytestmark = pytest.mark.unit


def test_engine_truncation_is_detected_from_usage() -> None:
    assert engine_truncated(512, 1000, 0)  # Ollama-style: cut to its context
    assert not engine_truncated(1000, 1000, 0)
    assert engine_truncated(1024, None, 4000)
    assert not engine_truncated(3000, None, 4000)  # the estimate errs high, so allow for it
    assert not engine_truncated(None, None, 4000)


def test_finish_records_one_outcome_and_both_lenses() -> None:
    m = GatewayMetrics()
    ex = Exchange(request_id="r", api="chat", path="/v1/chat/completions", route="r1", pool="p", backend_name="b")
    ex.sent_at = ex.started
    obs = ex.observer = StreamObserver(strip_usage=False)
    obs.first_token_at, obs.last_token_at, obs.gaps = ex.started + 0.5, ex.started + 1.5, [0.5, 0.5]
    obs.usage = {"prompt_tokens": 10, "completion_tokens": 3}
    ex.outcome = "success"
    Accounting(m).finish(ex)
    get = m.registry.get_sample_value
    labels = {"route": "r1", "pool": "p", "backend": "b", "api": "chat"}
    assert get("gateway_requests_total", {**labels, "outcome": "success"}) == 1
    assert get("gateway_output_tokens_total", {**labels, "source": "usage"}) == 3
    assert get("gateway_prompt_tokens_total", {**labels, "source": "usage"}) == 10
    fine = {"route": "r1", "pool": "p", "api": "chat"}  # the fine per-request histograms have no backend label
    assert get("gateway_time_to_first_token_seconds_sum", fine) == pytest.approx(0.5)
    assert get("gateway_inter_token_latency_seconds_count", fine) == 2
    assert get("gateway_request_duration_seconds_count", fine) == 1
    # Decode speed: the 2 tokens after the first, over the 1 s between first and last.
    assert get("gateway_request_output_tokens_per_second_sum", fine) == pytest.approx(2.0)
    assert get("gateway_time_to_first_token_seconds_sum", labels) is None


def test_events_that_came_in_one_read_are_itl_gaps_of_zero() -> None:
    m = GatewayMetrics()
    ex = Exchange(request_id="r", api="chat", path="/v1/chat/completions", route="r1", pool="p", backend_name="b")
    ex.sent_at = ex.started
    obs = ex.observer = StreamObserver(strip_usage=False)
    obs.first_token_at, obs.last_token_at, obs.gaps, obs.together = ex.started + 0.5, ex.started + 1.5, [1.0], 4
    obs.usage = {"prompt_tokens": 10, "completion_tokens": 6}
    ex.outcome = "success"
    Accounting(m).finish(ex)
    get = m.registry.get_sample_value
    fine = {"route": "r1", "pool": "p", "api": "chat"}
    assert get("gateway_inter_token_latency_seconds_count", fine) == 5  # one per content event after the first
    assert get("gateway_inter_token_latency_seconds_sum", fine) == pytest.approx(1.0)
    assert get("gateway_inter_token_latency_seconds_bucket", {**fine, "le": "0.0005"}) == 4


def test_no_usage_counts_content_chunks_as_estimated() -> None:
    m = GatewayMetrics()
    ex = Exchange(request_id="r", api="chat", path="/v1/chat/completions", route="r1", pool="p", backend_name="b")
    ex.sent_at = ex.started
    obs = ex.observer = StreamObserver(strip_usage=False)
    obs.content_events = 7
    ex.outcome = "client_closed"
    ex.disconnect_stage = "mid_stream"
    Accounting(m).finish(ex)
    get = m.registry.get_sample_value
    labels = {"route": "r1", "pool": "p", "backend": "b", "api": "chat"}
    assert get("gateway_output_tokens_total", {**labels, "source": "estimated"}) == 7
    assert get("gateway_client_disconnects_total", {**labels, "stage": "mid_stream"}) == 1
    labels.pop("api")  # wasted tokens: per backend, not per protocol
    assert get("gateway_disconnect_wasted_tokens_total", labels) == 7


def test_observe_many_matches_observe_one_by_one() -> None:
    values = [0.02, 0.0005, 99.0, 0.001, 0.0011, 0.0, 0.02, 3.0, 0.5, 0.001]  # bounds included, out of order
    bounds = (0.001, 0.02, 1.0)
    _check_observe_many(values, bounds)
    rng = random.Random(13)  # a stream's gaps on a fine histogram: many buckets, jittered
    fine = tuple(round(0.001 * 1.02**k, 6) for k in range(360))
    _check_observe_many([max(0.0, rng.gauss(0.02, 0.004)) for _ in range(300)] + [0.0, fine[5], 2.0], fine)


def _check_observe_many(values: list[float], bounds: tuple[float, ...]) -> None:
    from prometheus_client import CollectorRegistry, Histogram

    from gateway.metric_types import FineHistogram, observe_many

    samples = []
    for cls, batch in ((Histogram, False), (Histogram, True), (FineHistogram, True)):
        h = cls("h", "h", ("a",), buckets=bounds, registry=CollectorRegistry())
        child = h.labels("x")
        if batch:
            observe_many(child, values)
        else:
            for v in values:
                child.observe(v)
        metric = next(iter(h.collect()))
        samples.append([(s.name, s.labels, s.value) for s in metric.samples if not s.name.endswith("_created")])
    assert samples[0] == samples[1] == samples[2]
