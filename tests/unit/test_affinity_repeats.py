"""benchmarks/affinity.py's repeats: a policy's runs pooled into one row (counts summed, every
request's time to first token in the quantiles, each repeat's p90 kept, in-flight means averaged
and peaks maxed, traces tagged with their repeat), and a single run left as it is."""

from __future__ import annotations

import pytest

from benchmarks.affinity import RunResult, pooled

pytestmark = pytest.mark.unit


def run(hits: float, ttfts: list[float], mean: float, peak: int, cpu: float) -> RunResult:
    return RunResult(
        "kv_events",
        hits=hits,
        queries=10.0,
        requests=len(ttfts),
        ttft_s=ttfts,
        per_backend={"r0": len(ttfts)},
        reasons={"sticky": len(ttfts)},
        mean_in_flight={"r0": mean, "r1": 1.0},
        peak_in_flight={"r0": peak, "r1": 1},
        gateway_cpu_ms=cpu,
        trace=[{"index": i} for i in range(len(ttfts))],
        event_batches=3,
        events=7,
    )


def test_a_policys_repeats_are_pooled_into_one_row() -> None:
    first = run(4.0, [0.1] * 9 + [1.0], mean=2.0, peak=5, cpu=3.0)
    second = run(6.0, [0.2] * 10, mean=4.0, peak=3, cpu=5.0)
    row = pooled([first, second])
    assert (row.hits, row.queries, row.requests, row.hit_rate) == (10.0, 20.0, 20, 0.5)
    assert (row.event_batches, row.events) == (6, 14)
    assert sorted(row.ttft_s) == sorted(first.ttft_s + second.ttft_s)
    assert row.ttft_p90_runs_s == [1.0, 0.2]  # each repeat's own p90
    assert row.ttft(0.9) == 0.2  # the pooled one: 18 of the 20 are at or below 0.2
    assert row.mean_in_flight == {"r0": 3.0, "r1": 1.0} and row.peak_in_flight == {"r0": 5, "r1": 1}
    assert row.per_backend == {"r0": 20} and row.reasons == {"sticky": 20}
    assert row.gateway_cpu_ms == 4.0
    assert [t["repeat"] for t in row.trace] == [0] * 10 + [1] * 10


def test_one_run_is_its_own_row() -> None:
    only = run(4.0, [0.1, 0.2], mean=2.0, peak=5, cpu=3.0)
    assert pooled([only]) is only
