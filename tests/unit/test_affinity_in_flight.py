"""benchmarks/affinity.py's in-flight balance, from the client's own (backend, sent, finished)
spans: each backend's time-averaged count over the run, and its peak."""

from __future__ import annotations

import pytest

from benchmarks.affinity import in_flight

pytestmark = pytest.mark.unit


def test_the_mean_is_the_time_each_backend_held_requests_over_the_run() -> None:
    spans = [("r0", 0.0, 4.0), ("r0", 2.0, 6.0), ("r1", 1.0, 3.0)]
    means, _ = in_flight(spans, ["r0", "r1"], 8.0)
    assert means == {"r0": 1.0, "r1": 0.25}


def test_the_peak_counts_overlapping_requests_and_not_one_that_ends_as_another_starts() -> None:
    spans = [("r0", 0.0, 4.0), ("r0", 1.0, 2.0), ("r0", 1.5, 3.0), ("r0", 4.0, 5.0), ("r1", 0.0, 1.0)]
    _, peaks = in_flight(spans, ["r0", "r1", "r2"], 5.0)
    assert peaks == {"r0": 3, "r1": 1, "r2": 0}


def test_a_backend_that_got_nothing_has_no_load() -> None:
    means, peaks = in_flight([("r0", 0.0, 1.0)], ["r0", "r1"], 2.0)
    assert means["r1"] == 0.0 and peaks["r1"] == 0
