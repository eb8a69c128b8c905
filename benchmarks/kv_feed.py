"""The gateway's CPU per KV-event batch as it really receives them: a publisher in a process of its
own sends vLLM-shaped batches over ZMQ at a steady rate, and this process follows them with the
gateway's subscriber (its socket, its drain, the decoding and the index), as `gateway serve` does.
The figure is this process's CPU (every thread: ZMQ's I/O thread too) over the batches applied.

    PYTHONSAFEPATH=1 PYTHONPATH=. python3 benchmarks/kv_feed.py [--rate 1000] [--batches 10000] [--tokens 40]

Each batch is the one benchmarks/overhead/inprocess.py feeds per request (kvevents.batches): the
full blocks of a prompt of --tokens ids and 128 generated tokens stored, and an older request's
removed. The in-process harness calls the subscriber's decoding directly and so leaves out the
receiving; add this figure, at one batch per request, for a request's whole cost with events on.
An engine publishes one batch per step that stores or evicts blocks, so at a busy engine's rate
(hundreds of steps a second) a batch carries several requests' blocks, and one per request is the
high end."""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "overhead"))
import kvevents


def _publish(port: int, rate: float, frames: list[list[bytes]]) -> None:
    import zmq

    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    pub.bind(f"tcp://127.0.0.1:{port}")
    time.sleep(1.0)  # the subscriber joins; what a PUB sends before then is dropped
    start = time.monotonic()
    for i, f in enumerate(frames):
        pub.send_multipart([f[0], i.to_bytes(8, "big", signed=True), f[2]])
        wait = start + (i + 1) / rate - time.monotonic()
        if wait > 0:
            time.sleep(wait)
    time.sleep(1.0)
    pub.close(linger=1000)
    ctx.term()


async def _follow(args: argparse.Namespace, port: int) -> dict[str, float]:
    import zmq.asyncio

    from gateway.fleet.kvevents.index import EngineIndex
    from gateway.fleet.kvevents.subscriber import EventSubscriber

    ctx = zmq.asyncio.Context()
    sub = EventSubscriber(ctx, f"tcp://127.0.0.1:{port}", index=EngineIndex(), name="bench")
    task = asyncio.create_task(sub.run())
    while sub.stats.batches == 0:
        await asyncio.sleep(0.001)
    cpu, wall, first = time.process_time(), time.monotonic(), sub.stats.batches
    while sub.stats.batches + sub.stats.lost < args.batches:
        await asyncio.sleep(0.05)
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    ctx.destroy(linger=0)
    applied = sub.stats.batches - first
    return {
        "rate": args.rate,
        "batches": applied,
        "lost": sub.stats.lost,
        "cpu_us_per_batch": round(cpu / applied * 1e6, 2),
        "core_share": round(cpu / wall, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=1000, help="batches a second")
    parser.add_argument("--batches", type=int, default=10000)
    parser.add_argument("--tokens", type=int, default=40, help="prompt ids per batch (the overhead body's ~40)")
    args = parser.parse_args()
    prompts = [[1000 + (r * 7 + k) % 500 for k in range(args.tokens)] for r in range(args.batches)]
    frames = kvevents.batches(prompts, generated=128, keep=1000)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    publisher = multiprocessing.Process(target=_publish, args=(port, args.rate, frames))
    publisher.start()
    try:
        import uvloop

        result = uvloop.run(_follow(args, port))
    finally:
        publisher.join(timeout=30)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
