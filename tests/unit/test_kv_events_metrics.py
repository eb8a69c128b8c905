"""The KV-event subscribers' counters per backend (gateway_kv_events_batches_total and the rest,
gateway_kv_events_index_blocks) are on the page /metrics serves, not only in the registry."""

from __future__ import annotations

import pytest

from gateway.config_loader import parse_config
from gateway.fleet.kvevents.decode import BlockStored, EventBatch
from gateway.fleet.kvevents.fleet import follow
from gateway.metrics import GatewayMetrics
from gateway.policy.blockkeys import packed

pytestmark = pytest.mark.unit


def test_the_subscribers_counters_are_on_the_metrics_page_and_a_reload_repoints_them() -> None:
    backend = {"url": "http://127.0.0.1:9000", "name": "r0", "kv_events": {"endpoint": "tcp://127.0.0.1:5550"}}
    data = {
        "pools": {"p": {"engine": "vllm", "balancer": "kv_events", "backends": [backend]}},
        "routes": [{"model": "m", "pools": ["p"]}],
    }
    metrics = GatewayMetrics()
    first = follow(parse_config(data, env={}), metrics)
    assert first is not None
    sub = first.subscribers["r0"]
    sub._apply(0, b"")  # undecodable: counted
    sub.index.apply(EventBatch(0.0, (BlockStored((1, 2), None, packed(range(8)), 4),)))
    sub.stats.batches += 1
    page = metrics.exposition().decode()
    assert 'gateway_kv_events_batches_total{backend="r0"} 1.0' in page
    assert 'gateway_kv_events_undecodable_total{backend="r0"} 1.0' in page
    assert 'gateway_kv_events_index_blocks{backend="r0"} 2.0' in page
    assert page.count("# TYPE gateway_kv_events_batches_total counter") == 1

    second = follow(parse_config(data, env={}), metrics)  # a reload: the same collector, the new fleet
    assert second is not None
    page = metrics.exposition().decode()
    assert 'gateway_kv_events_batches_total{backend="r0"} 0.0' in page
    assert page.count("# TYPE gateway_kv_events_batches_total counter") == 1
    first.close()
    second.close()
