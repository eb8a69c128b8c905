"""Every PromQL expression the deploy files hold (Grafana dashboards, recording and alerting
rules), the metric names each one reads, and the gateway metric set they are checked against."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DASHBOARDS = DEPLOY / "grafana" / "dashboards"
RULES = DEPLOY / "prometheus" / "rules"
RECORDING_RULES = RULES / "recording.yml"

REQUIRE_PROMETHEUS_ENV = "GATEWAY_REQUIRE_PROMETHEUS"


@dataclass(frozen=True)
class MetricSpec:
    type: str  # counter | gauge | histogram, as prometheus_client names the family type
    labels: frozenset[str]

    def sample_names(self, family: str) -> set[str]:
        """The series names Prometheus stores for this family."""
        if self.type == "counter":
            return {f"{family}_total", f"{family}_created"}
        if self.type == "histogram":
            return {f"{family}_bucket", f"{family}_sum", f"{family}_count", f"{family}_created"}
        return {family}


_REQ = frozenset({"route", "pool", "backend"})
_FINE = frozenset({"route", "pool", "api"})  # the fine per-request histograms (gateway/metrics.py)
_API = frozenset({"api"})  # the client protocol (chat, completions, embeddings, messages, responses)

# The metric contract the dashboards, rules and docs were written against, keyed by family name
# (counters without `_total`, as prometheus_client names them). The tests use the real registry in
# gateway/metrics.py whenever it imports, and then also check that it still matches this table.
# TODO: drop this table (keep only the registry) once gateway/metrics.py is settled and committed.
EXPECTED_METRICS: Mapping[str, MetricSpec] = {
    "gateway_time_to_first_token_seconds": MetricSpec("histogram", _FINE),
    "gateway_inter_token_latency_seconds": MetricSpec("histogram", _FINE),
    "gateway_request_duration_seconds": MetricSpec("histogram", _FINE),
    "gateway_request_output_tokens_per_second": MetricSpec("histogram", _FINE),
    "gateway_output_tokens": MetricSpec("counter", _REQ | _API | {"source"}),
    "gateway_prompt_tokens": MetricSpec("counter", _REQ | _API | {"source"}),
    "gateway_requests": MetricSpec("counter", _REQ | _API | {"outcome"}),
    "gateway_requests_in_flight": MetricSpec("gauge", _REQ),
    "gateway_queue_wait_seconds": MetricSpec("histogram", frozenset({"route", "pool"})),
    "gateway_overhead_seconds": MetricSpec("histogram", frozenset({"route"})),
    "gateway_relay_overhead_seconds": MetricSpec("counter", frozenset({"route"})),
    "gateway_relay_chunks": MetricSpec("counter", frozenset({"route"})),
    "gateway_route_decisions": MetricSpec("counter", frozenset({"route", "pool", "rule"})),
    "gateway_context_cap": MetricSpec("counter", frozenset({"route", "action", "method"})),
    "gateway_truncated_messages": MetricSpec("counter", frozenset({"route"})),
    "gateway_dropped_features": MetricSpec("counter", frozenset({"route", "api", "feature"})),
    "gateway_retries": MetricSpec("counter", frozenset({"route", "pool"})),
    "gateway_retry_budget_exhausted": MetricSpec("counter", frozenset({"route"})),
    "gateway_upstream_errors": MetricSpec("counter", frozenset({"pool", "backend", "kind"})),
    "gateway_client_disconnects": MetricSpec("counter", _REQ | _API | {"stage"}),
    "gateway_disconnect_wasted_tokens": MetricSpec("counter", _REQ),
    "gateway_backend_up": MetricSpec("gauge", frozenset({"pool", "backend", "engine"})),
    "gateway_backend_model_info": MetricSpec("gauge", frozenset({"pool", "backend", "model"})),
    "gateway_backend_load": MetricSpec("gauge", frozenset({"pool", "backend", "engine", "signal"})),
    "gateway_backend_scrape_age_seconds": MetricSpec("gauge", frozenset({"pool", "backend"})),
    "gateway_inference_pool_endpoints": MetricSpec("gauge", frozenset({"pool", "inference_pool"})),
    "gateway_inference_pool_watch_restarts": MetricSpec("counter", frozenset({"pool", "inference_pool", "reason"})),
    "gateway_rate_limited": MetricSpec("counter", frozenset({"key", "limit"})),
    "gateway_budget_used_tokens": MetricSpec("gauge", frozenset({"key", "period", "kind"})),
    "gateway_class_queue_wait_seconds": MetricSpec("histogram", frozenset({"pool", "priority", "key"})),
    "gateway_shed_requests": MetricSpec("counter", frozenset({"pool", "priority", "reason"})),
    "gateway_limiter_backend_up": MetricSpec("gauge", frozenset({"store"})),
    "gateway_limiter_errors": MetricSpec("counter", frozenset({"store"})),
    "gateway_kv_events_predicted_cached_tokens": MetricSpec("counter", frozenset({"pool", "backend"})),
    "gateway_kv_events_served_cached_tokens": MetricSpec("counter", frozenset({"pool", "backend"})),
    "gateway_kv_events_predictions": MetricSpec("counter", frozenset({"pool", "backend", "verdict"})),
    "gateway_kv_events_prompt_ids": MetricSpec("counter", frozenset({"source"})),
    "gateway_event_loop_lag_seconds": MetricSpec("histogram", frozenset()),
}

# Series Prometheus makes itself for every target; the alerts may use them.
PROMETHEUS_SYNTHETIC = frozenset({"up"})
# Labels Prometheus attaches to every scraped series.
TARGET_LABELS = frozenset({"job", "instance"})


def real_metrics() -> dict[str, MetricSpec] | None:
    """The families registered by gateway.metrics.GatewayMetrics, or None if it doesn't import."""
    try:
        from gateway.metrics import GatewayMetrics
    except ImportError:
        return None
    metrics = GatewayMetrics()
    specs: dict[str, MetricSpec] = {}
    for collector in list(metrics.registry._collector_to_names):
        labels = frozenset(getattr(collector, "_labelnames", ()))
        describe = getattr(collector, "describe", None)
        families = describe() if describe is not None else collector.collect()
        for family in families:
            specs[family.name] = MetricSpec(family.type, labels)
    return specs


def gateway_metrics() -> Mapping[str, MetricSpec]:
    return real_metrics() or EXPECTED_METRICS


def sample_name_labels(specs: Mapping[str, MetricSpec]) -> dict[str, frozenset[str]]:
    """Series name -> its label names (plus `le` for histogram buckets)."""
    out: dict[str, frozenset[str]] = {}
    for family, spec in specs.items():
        for name in spec.sample_names(family):
            out[name] = spec.labels | {"le"} if name.endswith("_bucket") else spec.labels
    return out


# ---- where the expressions are ----------------------------------------------------------------


@dataclass(frozen=True)
class Expr:
    where: str  # "gateway.json: panel 'Title' A", "recording.yml: gateway:ttft_seconds:p50", ...
    expr: str
    grafana: bool = False  # uses Grafana variables, see substitute_grafana()


def _dashboard_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _dashboard_panels(panel.get("panels", []))  # collapsed rows nest their panels


def load_dashboard(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def dashboard_panels(path: Path) -> list[dict[str, Any]]:
    return list(_dashboard_panels(load_dashboard(path).get("panels", [])))


def dashboard_exprs(path: Path) -> list[Expr]:
    out = []
    for panel in dashboard_panels(path):
        for target in panel.get("targets", []):
            where = f"{path.name}: panel {panel.get('title')!r} {target.get('refId')}"
            out.append(Expr(where, target["expr"], grafana=True))
    return out


def dashboard_variable_queries(path: Path) -> list[Expr]:
    out = []
    for var in load_dashboard(path).get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        query = var["query"]
        text = query["query"] if isinstance(query, dict) else query
        out.append(Expr(f"{path.name}: variable {var['name']}", text, grafana=True))
    return out


def load_rules(path: Path) -> list[dict[str, Any]]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return [rule for group in data["groups"] for rule in group["rules"]]


def rule_files() -> list[Path]:
    return sorted(RULES.glob("*.yml"))


def rule_exprs(path: Path) -> list[Expr]:
    return [Expr(f"{path.name}: {r.get('record') or r.get('alert')}", r["expr"]) for r in load_rules(path)]


def recording_rule_names() -> set[str]:
    return {r["record"] for path in rule_files() for r in load_rules(path) if "record" in r}


def deploy_expressions(substitute: bool = True, rate_interval: str = "1m") -> list[Expr]:
    """Every PromQL expression in the dashboards and rule files; Grafana variables replaced when
    `substitute`, so that Prometheus itself can evaluate the result."""
    exprs = [e for path in sorted(DASHBOARDS.glob("*.json")) for e in dashboard_exprs(path)]
    exprs += [e for path in rule_files() for e in rule_exprs(path)]
    if substitute:
        exprs = [Expr(e.where, substitute_grafana(e.expr, rate_interval), e.grafana) for e in exprs]
    return exprs


_VAR = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


def substitute_grafana(expr: str, rate_interval: str = "1m") -> str:
    """Grafana's variables as Prometheus sees them with everything selected: `$route`/`$pool`
    (multi-value, allValue `.*`) become `.*`, and the interval variables a fixed window."""

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name in ("__rate_interval", "__interval", "__range"):
            return rate_interval
        return ".*"

    return _VAR.sub(repl, expr)


# ---- what an expression reads -----------------------------------------------------------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_SELECTOR = re.compile(r"([A-Za-z_:][\w:]*)?\s*\{([^{}]*)\}")
_MATCHER_LABEL = re.compile(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
_OFFSET = re.compile(r"\boffset\s+-?\w+")
_IDENT = re.compile(r"(?<![\w:.])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()")
_KEYWORDS = frozenset(
    {
        "and",
        "or",
        "unless",
        "bool",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "offset",
        "inf",
        "nan",
        "Inf",
        "NaN",
    }
)


def _blank_strings(expr: str) -> str:
    return _STRING.sub('""', expr)


def metric_names(expr: str) -> set[str]:
    """The series names an expression selects (not functions, keywords, labels or numbers)."""
    text = _blank_strings(expr)
    names = {m.group(1) for m in _SELECTOR.finditer(text) if m.group(1)}
    text = _SELECTOR.sub(lambda m: f" {m.group(1) or ''} ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _OFFSET.sub(" ", text)
    names |= {m.group(1) for m in _IDENT.finditer(text)}
    return names - _KEYWORDS


def selector_labels(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names matched) for each `name{...}` selector."""
    text = _blank_strings(expr)
    out = []
    for m in _SELECTOR.finditer(text):
        if m.group(1):
            out.append((m.group(1), {x.group(1) for x in _MATCHER_LABEL.finditer(m.group(2))}))
    return out


def grouping_labels(expr: str) -> set[str]:
    """Label names in by(...), without(...), on(...), ignoring(...), group_left/right(...)."""
    text = _blank_strings(expr)
    return {label.strip() for m in _GROUPING.finditer(text) for label in m.group(2).split(",") if label.strip()}


def label_values_metric(query: str) -> str | None:
    """The metric in a Grafana `label_values(metric{...}, label)` variable query."""
    m = re.match(r"\s*label_values\(\s*([A-Za-z_:][\w:]*)", query)
    return m.group(1) if m else None


# ---- binaries from Debian's `prometheus` package ------------------------------------------------


def require_binary(name: str) -> str:
    """The path of `name`, or skip; with GATEWAY_REQUIRE_PROMETHEUS=1 a missing binary fails."""
    path = shutil.which(name)
    if path is None:
        reason = f"{name} not found (apt-get install prometheus)"
        if os.environ.get(REQUIRE_PROMETHEUS_ENV) == "1":
            pytest.fail(f"{reason}, and {REQUIRE_PROMETHEUS_ENV}=1")
        pytest.skip(reason)
    return path
