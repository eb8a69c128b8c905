"""`gateway` with the soak's leak finders on; otherwise it is ``python -m gateway.cli``.

- tracemalloc (unless ``TRACED_GATEWAY_TRACEMALLOC=0``): each SIGUSR1 writes a snapshot to
  ``$TRACED_GATEWAY_DIR/snapshot-N.pickle`` (N counts from 0).
- SIGUSR2 prints pymalloc's statistics to stderr (``sys._debugmallocstats``: arenas, bytes in
  allocated blocks, i.e. live small objects, and free ones), calls glibc's ``malloc_trim(0)``, and
  appends ``rss_before_kib rss_after_kib`` to ``$TRACED_GATEWAY_DIR/trim.txt``: memory glibc holds but
  no object uses comes back. With ``TRACED_GATEWAY_COLLECT=1`` it runs ``gc.collect()`` first, and the
  line goes on with ``blocks_before blocks_after collected`` (``sys.getallocatedblocks()`` around the
  collection, and what it found unreachable): how much of the heap was cyclic garbage waiting for a
  full collection.
"""

from __future__ import annotations

import collections
import ctypes
import gc
import itertools
import os
import signal
import sys
import tracemalloc
from pathlib import Path
from types import FrameType

from gateway.cli import main


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _collect_and_name(folder: Path) -> int:
    """gc.collect() keeping what it finds, and the most common types of that garbage appended to
    garbage.txt (with the function names of any frames in it: where the cycles come from)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        found = gc.collect()
        kinds = collections.Counter(type(o).__qualname__ for o in gc.garbage)
        frames = collections.Counter(
            f"{o.f_code.co_filename.rsplit('/', 2)[-1]}:{o.f_code.co_name}"
            for o in gc.garbage
            if isinstance(o, FrameType)
        )
        with (folder / "garbage.txt").open("a") as out:
            out.write(f"{found} {kinds.most_common(12)}\nframes {frames.most_common(12)}\n")
    finally:
        gc.garbage.clear()
        gc.set_debug(0)
    # DEBUG_SAVEALL kept the cycles instead of freeing them, and clearing gc.garbage leaves them
    # cycles again: collect once more to free them, or every sample would find them all again (the
    # counts and the heap then grow by what earlier samples found, which is the tool, not a leak).
    gc.collect()
    return found


def run() -> int:
    folder = Path(os.environ.get("TRACED_GATEWAY_DIR", "."))
    counter = itertools.count()
    if os.environ.get("TRACED_GATEWAY_TRACEMALLOC", "1") != "0":
        tracemalloc.start(int(os.environ.get("TRACED_GATEWAY_FRAMES", "12")))

        def on_usr1(signum: int, frame: FrameType | None) -> None:
            tracemalloc.take_snapshot().dump(str(folder / f"snapshot-{next(counter)}.pickle"))

        signal.signal(signal.SIGUSR1, on_usr1)

    collect = os.environ.get("TRACED_GATEWAY_COLLECT") == "1"

    def on_usr2(signum: int, frame: FrameType | None) -> None:
        sys._debugmallocstats()
        before = _rss_kib()
        blocks = sys.getallocatedblocks()
        found = _collect_and_name(folder) if collect else 0
        after_blocks = sys.getallocatedblocks()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with (folder / "trim.txt").open("a") as out:
            extra = f" {blocks} {after_blocks} {found}" if collect else ""
            out.write(f"{before} {_rss_kib()}{extra}\n")

    signal.signal(signal.SIGUSR2, on_usr2)
    return main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(run())
