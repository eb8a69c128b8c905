"""The tracer's sampling decision (gateway/tracing/sampler.py): OTel's TraceIdRatioBased bound on the
trace id's lower 64 bits, parent-based samplers following the client's flag, and the W3C traceparent
parser that decides whether there is a parent at all."""

from __future__ import annotations

import pytest

from gateway.tracing.sampler import Sampler, parse_traceparent

pytestmark = pytest.mark.unit

LOW = (1 << 64) - 1
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"


@pytest.mark.parametrize("name", ["traceidratio", "parentbased_traceidratio"])
def test_ratio_edges(name: str) -> None:
    never, always = Sampler(name, 0.0), Sampler(name, 1.0)
    for trace_id in (0, 1, LOW, (7 << 64) | LOW, (1 << 128) - 1):
        assert never.root(trace_id) is False
        assert always.root(trace_id) is True


def test_ratio_is_traceidratiobased_bound_on_the_low_64_bits() -> None:
    half = Sampler("traceidratio", 0.5)
    assert half.bound == 1 << 63
    assert half.root((1 << 63) - 1) and not half.root(1 << 63)
    assert half.root((LOW << 64) | 5)  # the upper 64 bits do not count
    quarter = Sampler("traceidratio", 0.25)
    assert quarter.root((1 << 62) - 1) and not quarter.root(1 << 62)


def test_ratio_matches_the_sdk_sampler() -> None:
    """The same ids, the same decisions as opentelemetry-sdk's TraceIdRatioBased, where it is installed."""
    sampling = pytest.importorskip("opentelemetry.sdk.trace.sampling")
    import random

    rng = random.Random(7)
    for ratio in (0.001, 0.01, 0.3, 0.999):
        sdk, mine = sampling.TraceIdRatioBased(ratio), Sampler("traceidratio", ratio)
        assert mine.bound == sdk.bound
        for _ in range(2000):
            trace_id = rng.getrandbits(128)
            assert mine.root(trace_id) == sdk.should_sample(None, trace_id, "x").decision.is_sampled()


@pytest.mark.parametrize(
    ("name", "sampled_parent", "unsampled_parent", "root"),
    [
        ("parentbased_always_on", True, False, True),
        ("parentbased_always_off", True, False, False),
        ("parentbased_traceidratio", True, False, False),  # ratio 0 below: a new trace is left out
        ("always_on", True, True, True),  # not parent-based: the flag is not followed
        ("always_off", False, False, False),
        ("traceidratio", False, False, False),
    ],
)
def test_parent_flags(name: str, sampled_parent: bool, unsampled_parent: bool, root: bool) -> None:
    sampler = Sampler(name, 0.0)
    trace_id = 12345
    assert sampler.with_parent(trace_id, True) is sampled_parent
    assert sampler.with_parent(trace_id, False) is unsampled_parent
    assert sampler.root(trace_id) is root


def test_a_ratio_sampler_without_parent_base_samples_the_clients_trace_id() -> None:
    sampler = Sampler("traceidratio", 0.5)
    assert sampler.with_parent(1, False) is True and sampler.with_parent(LOW, True) is False


def test_traceparent_parsing() -> None:
    assert parse_traceparent(f"00-{TRACE}-{SPAN}-01") == (int(TRACE, 16), int(SPAN, 16), True)
    assert parse_traceparent(f" 00-{TRACE}-{SPAN}-00 ") == (int(TRACE, 16), int(SPAN, 16), False)
    assert parse_traceparent(f"00-{TRACE}-{SPAN}-03") == (int(TRACE, 16), int(SPAN, 16), True)
    assert parse_traceparent(f"01-{TRACE}-{SPAN}-01-later") == (int(TRACE, 16), int(SPAN, 16), True)
    for bad in (
        "",
        "garbage",
        f"ff-{TRACE}-{SPAN}-01",  # the forbidden version
        f"00-{TRACE}-{SPAN}-01-extra",  # version 00 has four fields
        f"00-{'0' * 32}-{SPAN}-01",
        f"00-{TRACE}-{'0' * 16}-01",
        f"00-{TRACE.upper()}-{SPAN}-01",
        f"00-{TRACE[:-1]}-{SPAN}-01",
        f"00-{TRACE}-{SPAN}-1",
        f"00-{TRACE[:-2]}_1-{SPAN}-01",  # int() would take the underscore
    ):
        assert parse_traceparent(bad) is None, bad


def test_gap_is_the_geometric_count_of_traces_left_out() -> None:
    import random

    assert Sampler("always_on", 0.0).gap(0.7) == 0
    assert Sampler("traceidratio", 1.0).gap(0.999) == 0
    assert Sampler("traceidratio", 0.0).gap(0.5) >= 1 << 62
    rng = random.Random(3)
    sampler = Sampler("traceidratio", 0.01)
    gaps = [sampler.gap(rng.random()) for _ in range(20000)]
    mean = sum(gaps) / len(gaps)
    assert 95 < mean < 103  # (1 - p) / p = 99; the standard error is 0.7
    assert 0.009 < gaps.count(0) / len(gaps) < 0.011 * 1.25  # P(0) = p
