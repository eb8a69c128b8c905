"""The observers' cost for one long SSE event fed in reads: the total and the worst single read, per
observer (relayed as it comes, usage stripped, a native Messages stream, held whole for a
translator), in process, no server:

    PYTHONPATH=$PWD python3 benchmarks/event_scan.py --mib 48 --read-kib 64

The event limit is raised past the event, so that the whole event is scanned."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.protocols.base import SseObserver
from gateway.protocols.native_observers import NativeObserver
from gateway.protocols.sse import StreamObserver

OBSERVERS: dict[str, Callable[[], SseObserver]] = {
    "relayed": lambda: StreamObserver(strip_usage=False),
    "usage stripped": lambda: StreamObserver(strip_usage=True),
    "native messages": NativeObserver.messages,
    "held for a translator": lambda: StreamObserver(strip_usage=False, whole_events=True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=float, default=48.0, help="the event's size")
    parser.add_argument("--read-kib", type=int, default=64, help="bytes per read")
    args = parser.parse_args()
    size, step = int(args.mib * (1 << 20)), args.read_kib << 10
    event = b'data: {"choices":[{"delta":{"content":"' + b"x" * size + b'"}}]}\n\n'
    for name, make in OBSERVERS.items():
        observer = make()
        observer.limit_events(len(event) + 1)
        worst = 0.0
        start = time.perf_counter()
        for at in range(0, len(event), step):
            chunk = event[at : at + step]
            t0 = time.perf_counter()
            observer.feed(chunk, 0.0)
            worst = max(worst, time.perf_counter() - t0)
        total = time.perf_counter() - start
        print(f"{name:22} total {total * 1e3:8.1f} ms, worst read {worst * 1e3:7.2f} ms")


if __name__ == "__main__":
    main()
