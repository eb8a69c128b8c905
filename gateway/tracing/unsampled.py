"""Requests the sampler left out. Nothing is recorded for them, but each upstream attempt still tells
the engine a context with the sampled flag off, so that the engine records nothing either; at a low
ratio that is nearly every request, and what it costs is most of what tracing costs.

A Python call or a new object is the expensive part on CPython (about 1,700 instructions a call on
the Python build measured in docs/tracing.md), so a new trace left out is one shared UnsampledRoot,
and its `propagate` cuts a finished `traceparent` from a pool: 1,024 of them are made at a time by C
loops (`os.urandom(...).hex()`, then one slice assignment per hex digit into a template), so that an
attempt costs one slice and one comparison.

The pool's ids are drawn uniformly among those a TraceIdRatioBased sampler of the same ratio leaves
out (lower 64 bits at or above the bound: the others are passed over), so that an engine sampling by
ratio rather than by the flag leaves them out too."""

from __future__ import annotations

import os

from gateway.tracing.base import AttemptSpan, Attributes

BATCH = 1024
"""Traceparents a refill makes (56 KiB)."""
_TEMPLATE = "00-" + "0" * 32 + "-" + "0" * 16 + "-00"
_SIZE = len(_TEMPLATE)  # 55
_LOW = slice(19, 35)  # the trace id's lower 64 bits, in a record
# Where each of a record's 48 random hex digits goes: the trace id's 32, then the span id's 16.
_PLACES = [*range(3, 35), *range(36, 52)]


class Unsampled:
    """A request the sampler left out: every span method does nothing. `recording` and `trace_id`
    are read several times a request: as slots (set per instance), CPython 3.11 specializes the
    reads, where a class attribute would be looked up through the type each time."""

    __slots__ = ("recording", "trace_id")

    def __init__(self) -> None:
        self.recording = False
        self.trace_id = ""

    def propagate(self, base: dict[str, str]) -> dict[str, str]:
        raise NotImplementedError

    def set(self, attributes: Attributes) -> None:
        return None

    def child(self, name: str, start: float, end: float, attributes: Attributes) -> None:
        return None

    def attempt(self, name: str, start: float, attributes: Attributes) -> AttemptSpan:
        raise RuntimeError("an unsampled trace has no attempt spans")

    def event(self, name: str, at: float, attributes: Attributes) -> None:
        return None

    def content(self, name: str, data: bytes) -> None:
        return None

    def end(self, attributes: Attributes, error: str | None, at: float) -> None:
        return None


class UnsampledRoot(Unsampled):
    """Every new trace the sampler left out (one object for all of them): each `propagate` gives the
    engine a fresh `00-<trace id>-<span id>-00`."""

    __slots__ = ("_at", "_bound", "_pool")

    def __init__(self, bound: int) -> None:
        super().__init__()
        # Lower-case hex of equal length orders as the numbers do, so the bound is compared as text;
        # at least 1, so that a kept id's lower half (and so the id) is never zero.
        self._bound = f"{max(bound, 1):016x}" if bound < 1 << 64 else "g"
        self._pool = ""
        self._at = 0
        os.register_at_fork(after_in_child=self._forget)  # a forked worker must not reuse the parent's ids

    def _forget(self) -> None:
        self._pool, self._at = "", 0

    def propagate(self, base: dict[str, str]) -> dict[str, str]:
        while True:
            i = self._at
            if i >= len(self._pool):
                self._pool, i = refill(), 0
            self._at = i + _SIZE
            if self._pool[i + 19 : i + 35] >= self._bound:
                base["traceparent"] = self._pool[i : i + _SIZE]
                return base


def refill() -> str:
    """BATCH traceparents with random ids, end to end; none has a zero span id."""
    while True:
        digits = os.urandom(BATCH * 24).hex().encode()
        records = bytearray(_TEMPLATE.encode() * BATCH)
        for k, place in enumerate(_PLACES):
            records[place::_SIZE] = digits[k::48]
        pool = records.decode()
        if "-" + "0" * 16 + "-" not in pool:  # a zero span id: one pool in 2^54 (draw again)
            return pool
