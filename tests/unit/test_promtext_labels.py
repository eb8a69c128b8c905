"""The one Prometheus text reader with labels (engines/promtext.py read_labelled), held against
prometheus_client's own parser on the real engines' recorded pages and on the gateway's /metrics."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from engines.promtext import read_labelled

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PAGES = sorted(p for engine in ("vllm", "sglang") for p in (FIXTURES / engine).glob("metrics*.txt"))


def reference(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): float(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def same(
    a: dict[tuple[str, frozenset[tuple[str, str]]], float], b: dict[tuple[str, frozenset[tuple[str, str]]], float]
) -> bool:
    return a.keys() == b.keys() and all(a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in a)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_an_engine_page_reads_as_prometheus_client_reads_it(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    got = read_labelled(text)
    assert len(got) > 100
    assert same(got, reference(text))


def test_escaped_label_values_are_decoded() -> None:
    registry = CollectorRegistry()
    counter = Counter("odd_total", "labels with every escape", ["v"], registry=registry)
    for value in ['a"b', "back\\slash", "new\nline", "}{,= ", ""]:
        counter.labels(v=value).inc(2)
    text = generate_latest(registry).decode()
    got = read_labelled(text)
    assert same(got, reference(text))
    assert got[("odd_total", frozenset({("v", 'a"b')}))] == 2.0
    assert got[("odd_total", frozenset({("v", "new\nline")}))] == 2.0


def test_malformed_lines_are_skipped_not_guessed() -> None:
    text = 'ok 1\nbad{v="unterminated 2\nnovalue\nnan_one NaN\nwith_ts 3 1700000000\n<html>\n'
    got = read_labelled(text)
    assert got[("ok", frozenset())] == 1.0 and got[("with_ts", frozenset())] == 3.0
    assert math.isnan(got[("nan_one", frozenset())])
    assert {name for name, _ in got} == {"ok", "nan_one", "with_ts"}
