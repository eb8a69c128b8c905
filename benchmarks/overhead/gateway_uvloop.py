"""Run `gateway <args>` with uvloop as the asyncio event loop, for the benchmark's variants.

`gateway serve` runs uvicorn's Server.serve() inside `asyncio.run(...)` (gateway/cli.py:cmd_serve),
so uvicorn's `loop="uvloop"` setting is never applied (uvicorn only uses it in Server.run()) and the
gateway runs on the pure-Python asyncio loop. This shim shows what the gateway costs once that is
fixed, without touching the gateway's code. Environment knobs (diagnostics for the benchmark):

    BENCH_GC_TUNE=1          gc.freeze() once the app has started, and a gen-0 threshold of 50,000
    BENCH_GC_STATS=FILE      count the cyclic collector's runs and time per generation; JSON at exit
    BENCH_LOOP=asyncio       keep the default asyncio loop (what `gateway serve` runs on today)
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import json
import os
import sys
import threading
import time

import uvloop

from gateway.cli import main


def _gc_stats(path: str) -> None:
    stats = {g: {"collections": 0, "seconds": 0.0, "collected": 0} for g in range(3)}
    started: list[float] = [0.0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            s = stats[info["generation"]]
            s["collections"] += 1
            s["seconds"] += time.perf_counter() - started[0]
            s["collected"] += info["collected"]

    def dump() -> None:
        with open(path, "w") as f:
            f.write(json.dumps(stats) + "\n")

    gc.callbacks.append(callback)
    atexit.register(dump)


def _gc_tune() -> None:
    # Collect gen 0 less often (with the default threshold of 700 the gateway runs one about every
    # 10 requests, and a 20 ms gen-2 walk of the whole heap about every 1,300, freeing almost nothing),
    # and once the server has started, freeze what startup built (modules, config, metrics, the app)
    # out of the collector's reach.
    gc.set_threshold(50_000, 20, 10)

    def freeze() -> None:
        gc.collect()
        gc.freeze()

    timer = threading.Timer(3.0, freeze)
    timer.daemon = True
    timer.start()


if __name__ == "__main__":
    if os.environ.get("BENCH_GC_STATS"):
        _gc_stats(os.environ["BENCH_GC_STATS"])
    if os.environ.get("BENCH_GC_TUNE"):
        _gc_tune()
    if os.environ.get("BENCH_LOOP", "uvloop") == "uvloop":
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    sys.exit(main(sys.argv[1:]))
