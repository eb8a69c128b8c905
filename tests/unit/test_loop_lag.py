"""The loop-lag monitor on a real event loop: a callback that holds the loop shows as one late tick
of about its length; ticks on an idle loop are on time; stop() ends the chain."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry

from gateway.app.loop_lag import LoopLag
from gateway.metric_types import LeanHistogram


def _histogram() -> LeanHistogram:
    return LeanHistogram("lag_seconds", "lag", buckets=(0.01, 0.05, 0.1, 1.0), registry=CollectorRegistry())


def _counts(h: LeanHistogram) -> tuple[float, float, list[float]]:
    samples = {(s.name, s.labels.get("le")): s.value for m in h.collect() for s in m.samples}
    buckets = [samples[("lag_seconds_bucket", le)] for le in ("0.01", "0.05", "0.1", "1.0", "+Inf")]
    return samples[("lag_seconds_count", None)], samples[("lag_seconds_sum", None)], buckets


async def test_a_held_loop_is_one_late_tick_of_its_length() -> None:
    h = _histogram()
    lag = LoopLag(h, interval_s=0.02)
    lag.start(asyncio.get_running_loop())
    await asyncio.sleep(0.1)  # idle: on-time ticks
    idle_count, idle_sum, _ = _counts(h)
    assert idle_count >= 3
    time.sleep(0.3)  # a callback that holds the loop for 300 ms
    await asyncio.sleep(0.05)
    lag.stop()
    count, total, buckets = _counts(h)
    late = buckets[4] - buckets[2]  # the ticks later than 100 ms
    assert late == 1, buckets  # one tick, not a catch-up burst that counts the stall again
    assert 0.25 <= total - idle_sum <= 0.5
    await asyncio.sleep(0.06)
    assert _counts(h)[0] == count  # stopped: no more ticks
