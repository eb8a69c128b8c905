"""Per-request latency histograms of the simulator, in model time (the sum of the steps' durations), with
vLLM 0.32's bucket bounds (tests/fixtures/vllm/metrics.txt): time to first token, inter-token latency,
end-to-end latency and time in the queue.

As in vLLM, a request's time to first token is observed when its first token is made (so an aborted one
that got that far counts), the inter-token latency at every later token, and end-to-end latency and queue
time only when it finishes (an aborted request adds neither).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
         40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
        80.0)  # fmt: skip
_REQUEST = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
            480.0, 960.0, 1920.0, 7680.0)  # fmt: skip


@dataclass
class Histogram:
    """A Prometheus histogram: ``counts[i]`` observations fell at or below ``bounds[i]`` but above the
    bound before it; the last count (``+Inf``) has the rest."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    sum: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    @property
    def count(self) -> int:
        return sum(self.counts)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, int]]:
        """(``le`` label value, cumulative count) per bucket, ``+Inf`` last."""
        out, running = [], 0
        for bound, n in zip((*(repr(float(b)) for b in self.bounds), "+Inf"), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


@dataclass
class LatencyStats:
    ttft: Histogram = field(default_factory=lambda: Histogram(_TTFT))
    inter_token: Histogram = field(default_factory=lambda: Histogram(_ITL))
    e2e: Histogram = field(default_factory=lambda: Histogram(_REQUEST))
    queue: Histogram = field(default_factory=lambda: Histogram(_REQUEST))
