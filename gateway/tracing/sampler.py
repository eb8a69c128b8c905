"""Which requests are recorded, decided before anything is built for them: the OTEL_TRACES_SAMPLER
algorithms (TraceIdRatioBased's: the trace id's lower 64 bits below ratio * 2^64; parentbased_*:
a client's sampled flag followed), and the W3C traceparent read from the client."""

from __future__ import annotations

import math

LOW64 = (1 << 64) - 1
_HEX = frozenset("0123456789abcdef")


class Sampler:
    """One OTEL_TRACES_SAMPLER: `root` for a new trace (or any trace, where the parent is not
    followed), `with_parent` for a trace a client's traceparent continues."""

    __slots__ = ("bound", "follow_parent")

    def __init__(self, name: str, ratio: float) -> None:
        if name.endswith("always_off"):
            self.bound = 0
        elif name.endswith("traceidratio"):
            self.bound = round(ratio * (1 << 64))  # as TraceIdRatioBased.get_bound_for_rate
        else:
            self.bound = 1 << 64
        self.follow_parent = name.startswith("parentbased_")

    def root(self, trace_id: int) -> bool:
        return (trace_id & LOW64) < self.bound

    def with_parent(self, trace_id: int, sampled: bool) -> bool:
        return sampled if self.follow_parent else (trace_id & LOW64) < self.bound

    def gap(self, uniform: float) -> int:
        """How many new traces in a row `root` leaves out before it records one, from a uniform draw
        in [0, 1): geometric with p = bound / 2^64, the same sequence of decisions as one draw per
        trace, for one draw per recorded trace (the tracer counts down; at 0.01 sampling that saves
        a call on 99 requests in 100)."""
        p = self.bound / (1 << 64)
        if p >= 1:
            return 0
        if p <= 0:
            return 1 << 62  # never
        return int(math.log1p(-uniform) / math.log1p(-p))


def parse_traceparent(header: str) -> tuple[int, int, bool] | None:
    """A W3C traceparent's trace id, parent span id and sampled flag; None where it is not valid
    (version ff, a zero id, bad hex, version 00 with more fields), and then the trace is a new one."""
    parts = header.strip().split("-")
    if len(parts) < 4:
        return None
    version, trace, span, flags = parts[0], parts[1], parts[2], parts[3]
    if len(version) != 2 or version == "ff" or len(trace) != 32 or len(span) != 16 or len(flags) != 2:
        return None
    if version == "00" and len(parts) != 4:
        return None
    if not _HEX.issuperset(version + trace + span + flags):  # lower-case hex only (int() takes more)
        return None
    trace_id, span_id = int(trace, 16), int(span, 16)
    if not (trace_id and span_id):
        return None
    return trace_id, span_id, bool(int(flags, 16) & 1)
