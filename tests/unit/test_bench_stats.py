"""gateway bench's arithmetic on synthetic timings with known answers: percentiles, per-request
decode speed, aggregate rates over the wall time, Little's-law concurrency, Poisson arrivals,
the SLO pick, the agreement check against the gateway's counters, and comparison ratios."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from gateway.bench.stats import (
    Timing,
    agreement,
    best_under_slo,
    level_stats,
    percentile,
    poisson_arrivals,
    ratios,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("values", "q", "want"),
    [
        ([1, 2, 3, 4, 5], 50, 3),
        ([1, 2, 3, 4], 50, 2.5),
        ([10, 20, 30, 40, 50], 90, 46),  # rank 3.6 between 40 and 50
        ([5, 1, 4, 2, 3], 0, 1),
        ([5, 1, 4, 2, 3], 100, 5),
        ([7], 99, 7),
        (list(range(101)), 99, 99),
        (list(range(1, 11)), 10, 1.9),
    ],
)
def test_percentile_interpolates_linearly(values: list[float], q: float, want: float) -> None:
    assert percentile(values, q) == pytest.approx(want)


def test_percentile_of_nothing_is_none_and_bad_q_is_refused() -> None:
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def stream(start: float, ttft: float, tokens: int, gap: float) -> Timing:
    """A perfect stream: first token after ``ttft``, then one token every ``gap`` seconds."""
    first = start + ttft
    last = first + gap * (tokens - 1)
    return Timing(
        start=start, end=last + 0.01, first_token=first, last_token=last, gaps=[gap] * (tokens - 1),
        content_events=tokens, completion_tokens=tokens, prompt_tokens=100, cached_tokens=25,
        finished=True, done=True,
    )  # fmt: skip


def test_level_of_four_equal_streams() -> None:
    # 4 users start together; each gets 11 tokens, one every 0.1 s after a 0.5 s TTFT: 10 tok/s each.
    timings = [stream(0.0, 0.5, 11, 0.1) for _ in range(4)]
    lv = level_stats(timings, concurrency=4, rate=None)
    wall = 0.5 + 1.0 + 0.01
    assert lv["requests"] == 4 and lv["errors"] == {}
    assert lv["per_request"]["ttft_s"] == pytest.approx({"p50": 0.5, "p90": 0.5, "p95": 0.5, "p99": 0.5})
    assert lv["per_request"]["itl_s"] == pytest.approx({"p50": 0.1, "p99": 0.1})
    assert lv["per_request"]["output_tok_s"] == pytest.approx({"p50": 10.0, "p10": 10.0})
    assert lv["per_request"]["e2e_s"]["p50"] == pytest.approx(wall)
    assert lv["aggregate"]["output_tok_s"] == pytest.approx(44 / wall)
    assert lv["aggregate"]["requests_s"] == pytest.approx(4 / wall)
    assert lv["aggregate"]["concurrency"] == pytest.approx(4.0)
    assert lv["stream_check"] == {"lost_events": 0, "merged_chunks": 0, "tokens_counted": 44, "tokens_reported": 44}
    assert lv["tokens"] == {"output": 44, "prompt": 400, "cached_prompt": 100}


def test_per_request_and_aggregate_lenses_differ() -> None:
    # One user alone at 10 tok/s, then 2 users sharing: each at 5 tok/s, together 10 tok/s.
    solo = level_stats([stream(0.0, 0.0, 101, 0.1)], 1, None)
    pair = level_stats([stream(0.0, 0.0, 101, 0.2), stream(0.0, 0.0, 101, 0.2)], 2, None)
    assert solo["per_request"]["output_tok_s"]["p50"] == pytest.approx(10.0)
    assert pair["per_request"]["output_tok_s"]["p50"] == pytest.approx(5.0)
    assert pair["aggregate"]["output_tok_s"] == pytest.approx(202 / 20.01)
    assert solo["aggregate"]["output_tok_s"] == pytest.approx(101 / 10.01)


def test_staggered_requests_give_littles_law_concurrency_and_slow_tail() -> None:
    # Request i starts at i seconds and lasts 2 s: at most 2 in flight; over the 11 s wall, 20/11 on average.
    timings = [stream(float(i), 0.0, 21, 0.1) for i in range(10)]
    for t in timings:
        t.end = t.start + 2.0
    timings[0].gaps, timings[0].last_token = [0.2] * 20, float(timings[0].start) + 4.0
    lv = level_stats(timings, 2, None)
    assert lv["aggregate"]["concurrency"] == pytest.approx(20 / 11)
    speeds = sorted([5.0] + [10.0] * 9)
    assert lv["per_request"]["output_tok_s"]["p10"] == pytest.approx(percentile(speeds, 10))
    assert lv["per_request"]["output_tok_s"]["p10"] < lv["per_request"]["output_tok_s"]["p50"] == 10.0


def test_errors_are_counted_by_kind_and_left_out_of_the_figures() -> None:
    bad = [Timing(start=0.0, end=0.1, error="http_503"), Timing(start=0.0, end=0.1, error="http_503")]
    bad.append(Timing(start=0.0, end=0.2, error="stream_cut"))
    lv = level_stats([stream(0.0, 0.5, 11, 0.1), *bad], 4, None)
    assert lv["errors"] == {"http_503": 2, "stream_cut": 1}
    assert lv["requests"] == 4
    assert lv["tokens"]["output"] == 11
    assert lv["per_request"]["ttft_s"]["p99"] == pytest.approx(0.5)


def test_a_stream_without_its_final_event_or_usage_or_with_extra_chunks_is_a_lost_event() -> None:
    no_done = stream(0.0, 0.1, 5, 0.1)
    no_done.done = False
    extra = stream(0.0, 0.1, 5, 0.1)
    extra.completion_tokens = 4  # the engine says 4, the client saw 5 chunks of content
    no_usage = stream(0.0, 0.1, 5, 0.1)
    no_usage.completion_tokens = None
    merged = stream(0.0, 0.1, 5, 0.1)
    merged.completion_tokens = 6  # two tokens in one chunk: not a loss
    lv = level_stats([no_done, extra, no_usage, merged, stream(0.0, 0.1, 5, 0.1)], 3, None)
    assert lv["stream_check"]["lost_events"] == 3
    assert lv["stream_check"]["merged_chunks"] == 1


def test_wall_override_for_interleaved_rounds() -> None:
    lv = level_stats([stream(0.0, 0.0, 11, 0.1), stream(100.0, 0.0, 11, 0.1)], 1, None, wall_s=2.02)
    assert lv["aggregate"]["output_tok_s"] == pytest.approx(22 / 2.02)


def test_poisson_arrivals_are_seeded_increasing_and_at_the_rate() -> None:
    a = poisson_arrivals(4.0, 20_000, seed=7)
    assert a == poisson_arrivals(4.0, 20_000, seed=7)
    assert a != poisson_arrivals(4.0, 20_000, seed=8)
    assert all(x < y for x, y in itertools.pairwise(a))
    gaps = [a[0]] + [y - x for x, y in itertools.pairwise(a)]
    # Exponential gaps of mean 1/rate: standard error of the mean 0.25/sqrt(20000) = 0.0018.
    assert statistics.fmean(gaps) == pytest.approx(0.25, abs=0.01)
    assert statistics.pstdev(gaps) == pytest.approx(0.25, abs=0.01)  # exponential: sd == mean
    # The share of gaps above the mean is e^-1 for an exponential.
    assert sum(g > 0.25 for g in gaps) / len(gaps) == pytest.approx(math.exp(-1), abs=0.01)
    with pytest.raises(ValueError):
        poisson_arrivals(0.0, 1, seed=0)


def test_best_under_slo_picks_the_highest_aggregate_within_the_bound() -> None:
    fast = level_stats([stream(0.0, 0.2, 11, 0.1)], 1, None)
    busy = level_stats([stream(0.0, 1.0, 11, 0.2) for _ in range(8)], 8, None)
    jammed = level_stats([stream(0.0, 3.0, 11, 0.3) for _ in range(32)], 32, None)
    best = best_under_slo([fast, busy, jammed], 2.0)
    assert best is not None and best["concurrency"] == 8
    assert best_under_slo([fast, busy, jammed], 0.1) is None


def test_agreement_with_the_gateways_counters() -> None:
    lv = level_stats([stream(0.0, 0.5, 11, 0.1) for _ in range(2)], 2, None)
    gw = {
        "output_tokens": 22.0, "prompt_tokens": 200.0, "ttft_s_mean": 0.49, "itl_s_mean": 0.1,
        "output_tok_s_mean": 10.0, "e2e_s_mean": 1.51,
    }  # fmt: skip
    ag = agreement(lv, gw)
    assert ag is not None and ag["tokens_equal"]
    assert ag["relative_difference"]["ttft_s"] == pytest.approx(0.5 / 0.49 - 1)
    assert ag["relative_difference"]["aggregate_output_tok_s"] == pytest.approx(0.0)
    differ = agreement(lv, {**gw, "output_tokens": 21.0})
    assert differ is not None and not differ["tokens_equal"]
    assert agreement(lv, None) is None


def test_ratios_against_the_baseline_target() -> None:
    a = {**level_stats([stream(0.0, 1.0, 11, 0.1)], 4, None), "target": "round_robin", "prefix_hit_rate": 0.2}
    b = {**level_stats([stream(0.0, 0.25, 11, 0.1)], 4, None), "target": "prefix_affinity", "prefix_hit_rate": 0.8}
    (r,) = ratios([a, b], "round_robin")
    assert r["target"] == "prefix_affinity" and r["concurrency"] == 4
    assert r["ttft_p50"] == pytest.approx(0.25)
    assert r["prefix_hit_rate"] == pytest.approx(4.0)
