"""The real-Prometheus fixture works, and every deploy expression is valid PromQL to it."""

from __future__ import annotations

import pytest

from tests.prometheus.prometheus_server import PrometheusServer, deploy_expressions

pytestmark = pytest.mark.prometheus


def test_prometheus_scrapes_itself(prometheus_self: PrometheusServer) -> None:
    prometheus_self.wait_for_targets_up()
    (target,) = prometheus_self.targets()
    assert target["labels"]["job"] == "prometheus"
    assert target["scrapeUrl"] == f"http://{prometheus_self.target}/metrics"
    prometheus_self.wait_for_rule_evaluations()
    assert prometheus_self.value('up{job="prometheus"}') == 1.0
    assert prometheus_self.query("prometheus_build_info")


def test_deploy_rules_load_and_evaluate_cleanly(prometheus_self: PrometheusServer) -> None:
    rules = prometheus_self.wait_for_rule_evaluations()
    names = {r["name"] for r in rules}
    assert {"gateway:ttft_seconds:p95", "gateway:output_tokens_per_second:rate1m", "GatewayDown"} <= names
    assert [r["name"] for r in rules if r["health"] != "ok"] == []


def test_every_deploy_expression_is_valid_promql(prometheus_self: PrometheusServer) -> None:
    exprs = deploy_expressions()
    assert len(exprs) > 50
    errors = []
    for e in exprs:
        try:
            prometheus_self.query(e.expr)
        except AssertionError as exc:
            errors.append(f"{e.where}: {exc}")
    assert errors == []
