"""The live progress bar (rich): one line per level and target, with requests done and the current
request and token rates."""

from __future__ import annotations

import time
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from gateway.bench.levels import Level, Target
from gateway.bench.stats import Timing


class LiveProgress:
    def __init__(self, console: Console) -> None:
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rates]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self._tasks: dict[tuple[str, Level], tuple[TaskID, float, list[int]]] = {}

    def __enter__(self) -> LiveProgress:
        self.progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.progress.stop()

    def on_level(self, target: Target, level: Level, total: int | None) -> None:
        name = f"{level.label}" + (f" · {target.name}" if target.name else "")
        task = self.progress.add_task(name, total=total, rates="")
        self._tasks[(target.name, level)] = (task, time.perf_counter(), [0, 0])

    def on_request(self, target: Target, level: Level, done: int, total: int | None, timing: Timing) -> None:
        task, started, counts = self._tasks[(target.name, level)]
        counts[0] += 1
        counts[1] += timing.completion_tokens or timing.content_events
        elapsed = max(time.perf_counter() - started, 1e-9)
        rates = f"{counts[0] / elapsed:.2f} req/s  {counts[1] / elapsed:.1f} tok/s"
        if timing.error is not None:
            rates += f"  last error: {timing.error}"
        self.progress.update(task, completed=done, rates=rates)
