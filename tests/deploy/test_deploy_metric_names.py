"""Every metric, label and recording rule the dashboard and rules use exists, and docs cover them."""

from __future__ import annotations

import re

import pytest

from tests.deploy.promql_sources import (
    DASHBOARDS,
    EXPECTED_METRICS,
    PROMETHEUS_SYNTHETIC,
    REPO,
    TARGET_LABELS,
    Expr,
    dashboard_variable_queries,
    deploy_expressions,
    gateway_metrics,
    grouping_labels,
    label_values_metric,
    metric_names,
    real_metrics,
    recording_rule_names,
    rule_files,
    sample_name_labels,
    selector_labels,
    substitute_grafana,
)

pytestmark = pytest.mark.unit

EXPRS = deploy_expressions(substitute=False)
SERIES_LABELS = sample_name_labels(gateway_metrics())
RECORDED = recording_rule_names()


def _ids(exprs: list[Expr]) -> list[str]:
    return [e.where for e in exprs]


def test_there_are_expressions_to_check() -> None:
    assert len(EXPRS) > 50
    assert any(e.grafana for e in EXPRS) and any(not e.grafana for e in EXPRS)


@pytest.mark.parametrize("e", EXPRS, ids=_ids(EXPRS))
def test_every_metric_read_exists(e: Expr) -> None:
    names = metric_names(e.expr)
    assert names, f"no metric found in {e.expr!r}"
    unknown = names - SERIES_LABELS.keys() - RECORDED - PROMETHEUS_SYNTHETIC
    assert not unknown, f"{e.where}: unknown metric(s) {sorted(unknown)}"


@pytest.mark.parametrize("e", EXPRS, ids=_ids(EXPRS))
def test_every_matched_label_exists(e: Expr) -> None:
    for name, labels in selector_labels(e.expr):
        if name in SERIES_LABELS:
            unknown = labels - SERIES_LABELS[name] - TARGET_LABELS
            assert not unknown, f"{e.where}: {name} has no label(s) {sorted(unknown)}"


@pytest.mark.parametrize("e", EXPRS, ids=_ids(EXPRS))
def test_grouping_labels_exist_on_the_metrics_read(e: Expr) -> None:
    names = metric_names(e.expr)
    if names & RECORDED:
        return  # a recording rule's output labels are checked where it is defined
    available = set(TARGET_LABELS)
    for name in names:
        available |= SERIES_LABELS.get(name, frozenset())
    unknown = grouping_labels(e.expr) - available
    assert not unknown, f"{e.where}: grouping by label(s) no metric here has: {sorted(unknown)}"


def test_variable_queries_use_gateway_metrics() -> None:
    queries = [q for path in DASHBOARDS.glob("*.json") for q in dashboard_variable_queries(path)]
    assert {q.where.split("variable ")[1] for q in queries} >= {"route", "pool"}
    for q in queries:
        name = label_values_metric(q.expr)
        assert name in SERIES_LABELS, f"{q.where}: {q.expr!r}"
        label = q.expr.rsplit(",", 1)[1].strip(" )")
        assert label in SERIES_LABELS[name], f"{q.where}: {name} has no label {label!r}"


def test_recording_rule_names_are_unique_and_level_metric_operation() -> None:
    names = [r for path in rule_files() for r in _record_names(path.read_text(encoding="utf-8"))]
    assert len(names) == len(set(names)), "duplicate recording rule"
    for name in names:
        assert re.fullmatch(r"gateway:[a-z0-9_]+(:[a-z0-9_]+)?", name), name


def _record_names(text: str) -> list[str]:
    return re.findall(r"^\s*-\s*record:\s*(\S+)", text, flags=re.M)


def test_both_lenses_are_recorded() -> None:
    assert {
        "gateway:ttft_seconds:p95",
        "gateway:itl_seconds:p95",
        "gateway:request_tokens_per_second:p50",
        "gateway:request_tokens_per_second:p10",
    } <= RECORDED
    assert {
        "gateway:output_tokens_per_second:rate1m",
        "gateway:concurrency",
        "gateway:requests_per_second:rate1m",
    } <= RECORDED


def test_rules_use_windows_that_hold_samples_at_short_scrape_intervals() -> None:
    for e in deploy_expressions(substitute=False):
        if e.grafana:
            assert "[$__rate_interval]" in e.expr or "[" not in e.expr, e.where
            continue
        for window in re.findall(r"\[(\w+)\]", e.expr):
            assert window in ("1m", "5m"), f"{e.where}: window {window}"


def test_expected_metrics_match_gateway_metrics_module() -> None:
    real = real_metrics()
    if real is None:
        pytest.skip("gateway.metrics is not importable yet")
    assert real == dict(EXPECTED_METRICS), "update EXPECTED_METRICS, docs/metrics.md and the dashboards"


def test_docs_describe_every_metric() -> None:
    text = (REPO / "docs" / "metrics.md").read_text(encoding="utf-8")
    for family, spec in gateway_metrics().items():
        name = f"{family}_total" if spec.type == "counter" else family
        assert f"`{name}`" in text, f"docs/metrics.md does not describe {name}"
    for name in RECORDED:
        assert f"`{name}`" in text, f"docs/metrics.md does not list recording rule {name}"


# ---- the extractor itself ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('histogram_quantile(0.95, sum by (route, le) (rate(a_bucket{route=~"x|y"}[1m])))', {"a_bucket"}),
        ("sum(rate(a_total[5m])) / sum(rate(b_total[5m])) > 1e-3", {"a_total", "b_total"}),
        ('x:y:z > 0.1 and on (route) sum by (route) (rate(c{k="by (m)"}[1m])) > 0', {"x:y:z", "c"}),
        ("up == 0", {"up"}),
        ("foo offset 5m", {"foo"}),
        ('max without (instance) (g{a!="b"})', {"g"}),
    ],
)
def test_metric_names(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_selector_and_grouping_labels() -> None:
    expr = 'sum by (pool, le) (rate(m_bucket{route=~"$route", pool!="none"}[1m])) and on (instance) up'
    assert selector_labels(expr) == [("m_bucket", {"route", "pool"})]
    assert grouping_labels(expr) == {"pool", "le", "instance"}


def test_substitute_grafana() -> None:
    assert substitute_grafana('rate(m{route=~"$route",pool=~"${pool}"}[$__rate_interval])') == (
        'rate(m{route=~".*",pool=~".*"}[1m])'
    )
