"""The metric types the gateway's registry is made of: prometheus_client's Counter, Gauge and
Histogram with lock-free samples (PlainValue: every update runs on the event loop's one thread),
and FineHistogram, the hundreds-of-buckets histogram that renders its own exposition; value_of and
observe_many, which update them past prometheus_client's checks; log_buckets, the fine
histograms' bounds. Used by metrics.py, which names
every gateway_* metric."""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import Any, cast

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString

_go: Callable[[float], str] = cast(Callable[[float], str], floatToGoString)  # typed alias


class PlainValue:
    """One sample's value, as prometheus_client's MutexValue but without its lock: every write runs
    on the event loop's one thread (requests, health checks, load scrapes), and /metrics, on the
    same thread, reads a float. The lock cost ~0.2 us an update, a dozen updates a request."""

    __slots__ = ("_exemplar", "_value")
    _multiprocess = False

    def __init__(self) -> None:
        self._value = 0.0
        self._exemplar: Any = None

    def inc(self, amount: float) -> None:
        self._value += amount

    def set(self, value: float, timestamp: float | None = None) -> None:
        self._value = value

    def set_exemplar(self, exemplar: Any) -> None:
        self._exemplar = exemplar

    def get(self) -> float:
        return self._value

    def get_exemplar(self) -> Any:
        return self._exemplar


class LeanCounter(Counter):
    """A Counter whose samples are PlainValues."""

    def _metric_init(self) -> None:
        self._value = PlainValue()
        self._created = time.time()


class LeanGauge(Gauge):
    """A Gauge whose samples are PlainValues (the gateway sets no multiprocess mode)."""

    def _metric_init(self) -> None:
        self._value = PlainValue()


class LeanHistogram(Histogram):
    """A Histogram whose samples are PlainValues, with a binary search for the bucket:
    prometheus_client's observe() walks the bounds one by one, which with hundreds of buckets costs
    microseconds per observation."""

    def _metric_init(self) -> None:
        self._buckets = [PlainValue() for _ in self._upper_bounds]
        self._created = time.time()
        self._sum = PlainValue()

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        if math.isnan(amount) or (self._labelnames and not self._labelvalues):
            super().observe(amount, exemplar)  # and its error for a parent with labels
            return
        self._sum._value += amount
        bucket = self._buckets[bisect_left(self._upper_bounds, amount)]
        bucket._value += 1
        if exemplar is not None:  # the bucket's latest, as prometheus_client keeps it (a trace id)
            bucket._exemplar = Exemplar(exemplar, amount, time.time())


class FineHistogram(LeanHistogram):
    """A LeanHistogram with hundreds of buckets, which renders its own exposition."""

    def render(self, cache: dict[tuple[str, ...], list[str]], openmetrics: bool = False) -> str:
        """This histogram in the text format, line for line what generate_latest writes (which
        takes ~10 us a sample: 70 ms for the shipped config's ~7k). Each child's line prefixes are
        built once, in `cache`, so a render is a lookup and a number per line. `openmetrics`: as
        prometheus_client's OpenMetrics generate_latest writes it instead, each bucket's exemplar
        (a trace id) after its count, _created inside the family, no # EOF (the page adds it)."""
        doc = self._documentation.replace("\\", r"\\").replace("\n", r"\n")
        name = self._name
        with self._lock:
            items = list(self._metrics.items()) if self._labelnames else [((), self)]
        children = cast(list[tuple[tuple[str, ...], FineHistogram]], items)
        out = [f"# HELP {name} {doc}\n# TYPE {name} histogram\n"]
        created = [f"# HELP {name}_created {doc}\n# TYPE {name}_created gauge\n"]
        for values, child in children:
            prefixes = cache.get(values)
            if prefixes is None:
                prefixes = cache[values] = self._prefixes(values)
            total = 0.0
            for prefix, bucket in zip(prefixes, child._buckets, strict=False):
                total += bucket.get()
                if openmetrics and bucket._exemplar is not None:
                    out.append(f"{prefix}{_go(total)}{_exemplar(bucket._exemplar)}\n")
                else:
                    out.append(f"{prefix}{_go(total)}\n")
            out.append(f"{prefixes[-3]}{_go(total)}\n")
            out.append(f"{prefixes[-2]}{_go(child._sum.get())}\n")
            if openmetrics:
                out.append(f"{prefixes[-1]}{_go(child._created)}\n")
            else:
                created.append(f"{prefixes[-1]}{_go(child._created)}\n")
        return "".join(out + created) if len(created) > 1 else "".join(out)

    def _prefixes(self, values: tuple[str, ...]) -> list[str]:
        """`name_bucket{labels,le="b"} ` for every bound, then _count, _sum and _created's."""

        def labels(extra: dict[str, str]) -> str:
            pairs = sorted({**dict(zip(self._labelnames, values, strict=True)), **extra}.items())
            inner = ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)
            return f"{{{inner}}}" if inner else ""

        name = self._name
        out = [f"{name}_bucket{labels({'le': _go(b)})} " for b in self._upper_bounds]
        return out + [f"{name}_{suffix}{labels({})} " for suffix in ("count", "sum", "created")]


def _exemplar(exemplar: Exemplar) -> str:
    """` # {trace_id="..."} value timestamp`, an OpenMetrics exemplar."""
    labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(exemplar.labels.items()))
    stamp = f" {exemplar.timestamp}" if exemplar.timestamp is not None else ""
    return f" # {{{labels}}} {_go(exemplar.value)}{stamp}"


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def value_of(child: Counter | Gauge) -> PlainValue:
    """A lean child's sample, to update without the metric's checks (a counter's is never negative:
    the callers add counts)."""
    found = child._value
    assert isinstance(found, PlainValue)
    return found


def observe_many(child: Histogram, values: Sequence[float], zeros: int = 0) -> None:
    """child.observe(v) for every value, and `zeros` observations of 0.0, at the cost of one lock
    per distinct bucket hit (plus one for the sum) instead of two per value: the values are
    bucketed here first."""
    if zeros:
        child._buckets[0].inc(zeros)  # 0.0 is under every bound; it adds nothing to the sum
    if len(values) < 4:
        for v in values:
            child.observe(v)
        return
    # In order, each value moves the bucket on from the last one's: a sort in C and a walk over
    # the buckets the values span, where a bisect_left a value cost ~1.4k instructions compiled (a
    # call and boxed compares; a fine histogram has ~360 bounds) and about the same in Python.
    ordered = sorted(values)
    bounds: list[float] = child._upper_bounds  # prometheus_client has no batch observe
    buckets = child._buckets
    i = bisect_left(bounds, ordered[0])
    n = 0
    for v in ordered:
        if v > bounds[i]:  # past this bucket's bound (the last bound is +Inf: none is past it)
            if n:
                buckets[i].inc(n)
                n = 0
            i += 1
            while v > bounds[i]:
                i += 1
        n += 1
    buckets[i].inc(n)
    child._sum.inc(sum(values))


def log_buckets(low: float, high: float, per_decade: int) -> tuple[float, ...]:
    """Bucket bounds from `low` to `high`, `per_decade` log-spaced ones in every factor of ten
    (10 ** (i / per_decade), so 0.01, 0.1, 1, 10 are among them), rounded to 4 significant digits."""
    first, last = round(math.log10(low) * per_decade), round(math.log10(high) * per_decade)
    return tuple(float(f"{10 ** (i / per_decade):.4g}") for i in range(first, last + 1))
