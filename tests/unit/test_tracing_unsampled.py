"""The traceparents of traces the sampler left out (gateway/tracing/unsampled.py) and the tracer's root
decision (recorder.py): valid W3C values with the sampled flag off, a fresh id each time, a trace id
that a TraceIdRatioBased sampler of the same ratio also leaves out, a ratio kept, and a forked child
that does not repeat its parent's ids."""

from __future__ import annotations

import os

import pytest

from gateway.tracing.recorder import RecordingTracing
from gateway.tracing.sampler import Sampler, parse_traceparent
from gateway.tracing.settings import tracing_settings
from gateway.tracing.unsampled import BATCH, UnsampledRoot, refill

pytestmark = pytest.mark.unit


def tracer(ratio: float) -> RecordingTracing:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": str(ratio),
    }
    settings = tracing_settings(None, env)
    assert settings is not None
    return RecordingTracing(settings)


@pytest.mark.parametrize("ratio", [0.0, 0.01, 0.5, 0.999])
def test_ids_are_valid_fresh_and_left_out_by_the_same_ratio(ratio: float) -> None:
    sampler = Sampler("traceidratio", ratio)
    root = UnsampledRoot(sampler.bound)
    seen = set()
    for _ in range(3 * BATCH):  # across refills
        value = root.propagate({"x-request-id": "a"})["traceparent"]
        parsed = parse_traceparent(value)
        assert parsed is not None, value
        trace_id, _span_id, sampled = parsed
        assert not sampled and value.endswith("-00")
        assert not sampler.root(trace_id), f"{value} would be sampled at {ratio}"
        seen.add(trace_id)
    assert len(seen) == 3 * BATCH


def test_a_high_bound_still_yields_ids() -> None:
    bound = 15 << 60  # 15 ids in 16 are sampled: most draws are cut and passed over
    for _ in range(100):
        assert int(UnsampledRoot(bound).propagate({})["traceparent"][19:35], 16) >= bound


def test_a_left_out_request_builds_nothing_and_each_attempt_gets_a_fresh_id() -> None:
    t = tracer(0.0)
    first, second = t.request("POST", "/v1/chat/completions", {}, 1.0), t.request("POST", "/x", {}, 2.0)
    assert first is second and not first.recording and first.trace_id == ""
    a, b = first.propagate({})["traceparent"], first.propagate({})["traceparent"]
    assert a != b and parse_traceparent(a) is not None and a.endswith("-00")


def test_the_root_decision_keeps_the_ratio_and_a_sampled_id_agrees_with_it() -> None:
    t, sampler = tracer(0.25), Sampler("traceidratio", 0.25)
    recorded = [s for s in (t.request("POST", "/x", {}, 1.0) for _ in range(8000)) if s.recording]
    assert 1700 < len(recorded) < 2300  # 2000 expected; 8 standard deviations either side is ~310
    for span in recorded:
        assert sampler.root(int(span.trace_id, 16)), span.trace_id


def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    root = UnsampledRoot(0)
    root.propagate({})  # the parent's pool is filled
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, to the parent
        os.close(read)
        os.write(write, root.propagate({})["traceparent"].encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 100).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert parse_traceparent(child) is not None
    assert child != root.propagate({})["traceparent"]


def test_a_pool_is_random_hex_in_the_w3c_layout() -> None:
    pool = refill()
    assert len(pool) == BATCH * 55
    records = [pool[i : i + 55] for i in range(0, len(pool), 55)]
    assert len(set(records)) == BATCH
    for record in records:
        version, trace, span, flags = record.split("-")
        assert (version, flags) == ("00", "00") and len(trace) == 32 and len(span) == 16
    digits = pool.replace("-", "")
    assert set(digits) <= set("0123456789abcdef")
    # Every hex digit of the ids is used: each of the 16 turns up about 1/16 of the time.
    ids = "".join(r[3:35] + r[36:52] for r in records)
    for d in "0123456789abcdef":
        assert 0.05 < ids.count(d) / len(ids) < 0.075, d
