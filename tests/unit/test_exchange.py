"""The finish step's accounting and the silent-truncation check."""

from __future__ import annotations

import pytest

from gateway.exchange import Exchange
from gateway.metrics import GatewayMetrics
from gateway.sse import StreamObserver

pytestmark = pytest.mark.unit


def test_engine_truncation_is_detected_from_usage() -> None:
    ex = Exchange(request_id="r", kind="chat", metrics=GatewayMetrics())
    ex.prompt_exact = 1000
    assert ex.engine_truncated({"prompt_tokens": 512})  # Ollama-style: cut to its context
    assert not ex.engine_truncated({"prompt_tokens": 1000})
    ex.prompt_exact, ex.prompt_estimate = None, 4000
    assert ex.engine_truncated({"prompt_tokens": 1024})
    assert not ex.engine_truncated({"prompt_tokens": 3000})  # the estimate errs high, so allow for it
    assert not ex.engine_truncated({})


def test_finish_records_one_outcome_and_both_lenses() -> None:
    m = GatewayMetrics()
    ex = Exchange(request_id="r", kind="chat", metrics=m, route="r1", pool="p", backend_name="b")
    ex.sent_at = ex.started
    obs = ex.observer = StreamObserver(strip_usage=False)
    obs.first_token_at, obs.last_token_at, obs.gaps = ex.started + 0.5, ex.started + 1.5, [0.5, 0.5]
    obs.usage = {"prompt_tokens": 10, "completion_tokens": 3}
    ex.outcome = "success"
    ex.finish()
    get = m.registry.get_sample_value
    labels = {"route": "r1", "pool": "p", "backend": "b"}
    assert get("gateway_requests_total", {**labels, "outcome": "success"}) == 1
    assert get("gateway_output_tokens_total", {**labels, "source": "usage"}) == 3
    assert get("gateway_prompt_tokens_total", {**labels, "source": "usage"}) == 10
    fine = {"route": "r1", "pool": "p"}  # the fine per-request histograms have no backend label
    assert get("gateway_time_to_first_token_seconds_sum", fine) == pytest.approx(0.5)
    assert get("gateway_inter_token_latency_seconds_count", fine) == 2
    assert get("gateway_request_duration_seconds_count", fine) == 1
    # Decode speed: the 2 tokens after the first, over the 1 s between first and last.
    assert get("gateway_request_output_tokens_per_second_sum", fine) == pytest.approx(2.0)
    assert get("gateway_time_to_first_token_seconds_sum", labels) is None


def test_no_usage_counts_content_chunks_as_estimated() -> None:
    m = GatewayMetrics()
    ex = Exchange(request_id="r", kind="chat", metrics=m, route="r1", pool="p", backend_name="b")
    ex.sent_at = ex.started
    obs = ex.observer = StreamObserver(strip_usage=False)
    obs.content_events = 7
    ex.outcome = "client_closed"
    ex.disconnect_stage = "mid_stream"
    ex.finish()
    get = m.registry.get_sample_value
    labels = {"route": "r1", "pool": "p", "backend": "b"}
    assert get("gateway_output_tokens_total", {**labels, "source": "estimated"}) == 7
    assert get("gateway_client_disconnects_total", {**labels, "stage": "mid_stream"}) == 1
    assert get("gateway_disconnect_wasted_tokens_total", labels) == 7
