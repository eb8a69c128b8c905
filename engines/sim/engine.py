"""Runs the simulator's batching core in real time on the event loop: one asyncio task per engine.

The HTTP server uses it; so can any in-process caller (no sockets), e.g.::

    async with SimEngine(SimParams.preset("fast")) as engine:
        seq = await engine.generate(SimSequence(prompt_tokens=100, max_tokens=8))

For policy comparisons that should not take real time, use ``engines.sim.whatif`` instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType

from engines.sim.model import BatchCore, SimParams, SimSequence


class SimEngine:
    """A ``BatchCore`` whose steps take real time. ``submit`` returns an event set after every step
    that gave the sequence a token (and when it finishes or is aborted); clear it before reading."""

    def __init__(self, params: SimParams) -> None:
        self.core = BatchCore(params)
        self._wake = asyncio.Event()
        self._listeners: dict[int, asyncio.Event] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-batch-loop")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def __aenter__(self) -> SimEngine:
        self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    def submit(self, seq: SimSequence) -> asyncio.Event:
        self.core.submit(seq)
        event = asyncio.Event()
        self._listeners[seq.seq_id] = event
        self._wake.set()
        return event

    def abort(self, seq: SimSequence) -> bool:
        """Stop the sequence's work at once (frees its batch slot and KV reservation)."""
        aborted = self.core.abort(seq)
        event = self._listeners.pop(seq.seq_id, None)
        if event is not None:
            event.set()
        return aborted

    async def generate(self, seq: SimSequence) -> SimSequence:
        """Submit and wait for the sequence to finish; cancelling the caller aborts it."""
        event = self.submit(seq)
        try:
            while seq.state in ("waiting", "running"):
                event.clear()
                await event.wait()
        finally:
            self.abort(seq)
        return seq

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while True:
            if not self.core.has_work:
                self._wake.clear()
                await self._wake.wait()
                deadline = loop.time()
            duration = self.core.begin_step()
            if duration <= 0:
                continue
            # Sleep to an absolute deadline so per-step overhead does not accumulate into drift, but never
            # run more than one step late (a stalled loop should not cause a burst of instant steps).
            now = loop.time()
            deadline = max(deadline + duration, now)
            await asyncio.sleep(deadline - now)
            for seq in self.core.end_step():
                event = self._listeners.get(seq.seq_id)
                if event is not None:
                    event.set()
                if seq.state == "finished":
                    self._listeners.pop(seq.seq_id, None)
