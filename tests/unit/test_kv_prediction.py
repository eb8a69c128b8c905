"""Predicted against served prefix hits: the KV-event index's prediction for the backend an attempt
went to, set against the cached_tokens its answer reports, counted per backend."""

from __future__ import annotations

import pytest

from gateway.metrics import GatewayMetrics
from gateway.pipeline.accounting import Accounting
from gateway.pipeline.exchange import Exchange
from gateway.policy.cached_prefix import CachedPrefix

pytestmark = pytest.mark.unit


def finished(m: GatewayMetrics, predicted: int | None, usage: dict[str, object] | None, backend: str = "r0") -> None:
    ex = Exchange(request_id="r", api="chat", path="/v1/chat/completions", route="r1", pool="p", backend_name=backend)
    ex.sent_at = ex.started
    ex.predicted_cached = predicted
    ex.usage = usage
    ex.outcome = "success"
    Accounting(m).finish(ex)


def test_a_backends_prediction_is_its_matched_blocks_at_its_block_size() -> None:
    cached = CachedPrefix((("r0", 3), ("r1", 0)), 4, (("r0", 128), ("r1", 16)))
    assert cached.tokens("r0") == 384
    assert cached.tokens("r1") == 0
    assert cached.tokens("llamacpp") is None  # streams no events: no prediction to compare


def test_predicted_and_served_tokens_are_counted_per_backend_with_a_verdict() -> None:
    m = GatewayMetrics()
    finished(m, 256, {"prompt_tokens": 300, "prompt_tokens_details": {"cached_tokens": 256}})
    finished(m, 384, {"prompt_tokens": 500, "prompt_tokens_details": {"cached_tokens": 128}})  # evicted since
    finished(m, 0, {"prompt_tokens": 500, "prompt_tokens_details": {"cached_tokens": 128}}, backend="r1")
    get = m.registry.get_sample_value
    r0, r1 = {"pool": "p", "backend": "r0"}, {"pool": "p", "backend": "r1"}
    assert get("gateway_kv_events_predicted_cached_tokens_total", r0) == 640
    assert get("gateway_kv_events_served_cached_tokens_total", r0) == 384
    assert get("gateway_kv_events_predictions_total", {**r0, "verdict": "exact"}) == 1
    assert get("gateway_kv_events_predictions_total", {**r0, "verdict": "over"}) == 1
    assert get("gateway_kv_events_predicted_cached_tokens_total", r1) == 0
    assert get("gateway_kv_events_served_cached_tokens_total", r1) == 128
    assert get("gateway_kv_events_predictions_total", {**r1, "verdict": "under"}) == 1
    page = m.exposition().decode()  # what /metrics serves, not only the registry
    assert 'gateway_kv_events_predicted_cached_tokens_total{backend="r0",pool="p"} 640.0' in page
    assert 'gateway_kv_events_served_cached_tokens_total{backend="r1",pool="p"} 128.0' in page


def test_no_prediction_or_no_reported_hit_is_not_compared() -> None:
    m = GatewayMetrics()
    finished(m, None, {"prompt_tokens": 300, "prompt_tokens_details": {"cached_tokens": 256}})  # not a kv_events pool
    finished(m, 256, {"prompt_tokens": 300})  # an engine started without --enable-prompt-tokens-details
    finished(m, 256, None)
    get = m.registry.get_sample_value
    assert get("gateway_kv_events_predicted_cached_tokens_total", {"pool": "p", "backend": "r0"}) is None
    assert get("gateway_kv_events_served_cached_tokens_total", {"pool": "p", "backend": "r0"}) is None
