"""`gateway` with tracemalloc on: the soak's leak finder. Each SIGUSR1 writes a snapshot to
``$TRACED_GATEWAY_DIR/snapshot-N.pickle`` (N counts from 0); otherwise it is ``python -m gateway.cli``."""

from __future__ import annotations

import itertools
import os
import signal
import sys
import tracemalloc
from pathlib import Path
from types import FrameType

from gateway.cli import main


def _dump(counter: itertools.count[int], folder: Path) -> None:
    tracemalloc.take_snapshot().dump(str(folder / f"snapshot-{next(counter)}.pickle"))


def run() -> int:
    tracemalloc.start(int(os.environ.get("TRACED_GATEWAY_FRAMES", "12")))
    folder = Path(os.environ.get("TRACED_GATEWAY_DIR", "."))
    counter = itertools.count()

    def on_usr1(signum: int, frame: FrameType | None) -> None:
        _dump(counter, folder)

    signal.signal(signal.SIGUSR1, on_usr1)
    return main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(run())
