"""The event loop's lag, measured from inside: a timer due every `interval_s` notes how late it ran
into gateway_event_loop_lag_seconds. A callback that holds the loop (a huge event parsed, a slow
render) delays every request on the process by as much, and this is where that shows, whatever the
request; a client's probe sees it too, but with the network and the HTTP exchange in it.

A chain of call_at handles, not a task: no coroutine and no task wake a tick (10 a second)."""

from __future__ import annotations

import asyncio

from gateway.metric_types import LeanHistogram


class LoopLag:
    __slots__ = ("_due", "_handle", "_histogram", "_interval_s", "_loop")

    def __init__(self, histogram: LeanHistogram, interval_s: float = 0.1) -> None:
        self._histogram = histogram
        self._interval_s = interval_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._due = loop.time() + self._interval_s
        self._handle = loop.call_at(self._due, self._tick)

    def _tick(self) -> None:
        loop = self._loop
        assert loop is not None
        now = loop.time()
        self._histogram.observe(max(0.0, now - self._due))
        # The next tick from now, not from when this one was due: a long stall is one late tick,
        # not a burst of catch-up ones that would each count it again.
        self._due = now + self._interval_s
        self._handle = loop.call_at(self._due, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
