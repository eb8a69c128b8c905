"""1,000 concurrent streams through one gateway process: errors, and the gateway's RSS and open fds
before, at the peak and after.

The stack (benchmarks/loopstack.py): two simulated vLLM engines (a simulator, not a real engine) in
one process, each batching up to 1,024 sequences with a fixed --step-s per decode step (so every stream
gets a token every step however many run), and `gateway serve` in another process, on loopback. Each
backend has max_in_flight --max-in-flight (the gateway's admission limit; past it a request waits in
the queue, limits.max_queue, or gets 429), so the pool takes 2 x that at once.

The client opens --streams streamed chat completions over --ramp-s seconds, each on its own connection,
each asking for --tokens tokens, and reads every one to its end. A stream is ok when it is a 200 that
ends with [DONE] after --tokens content chunks. Readings after: 3 s (the clients have gone; the
gateway's upstream pool still keeps idle keep-alive connections) and 23 s (past the pool's 15 s idle
limit, swept every 5 s, so they are closed too). --rounds runs it again in the same gateway process: a second
round that ends where the first did is a plateau, not a leak. It stops by itself: every stream ends after
~tokens x step-s, and the whole run is bounded by --timeout-s.

    PYTHONPATH=$PWD python3 benchmarks/load_streams.py --streams 1000 --out /tmp/gateway-load
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loopstack


async def one_stream(session: aiohttp.ClientSession, url: str, tokens: int, index: int) -> tuple[str, float]:
    body = {
        "model": loopstack.MODEL,
        "messages": [{"role": "user", "content": f"stream number {index}"}],
        "max_tokens": tokens,
        "stream": True,
    }
    started = time.monotonic()
    try:
        async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
            if resp.status != 200:
                await resp.read()
                return f"status:{resp.status}", time.monotonic() - started
            chunks, done, buffer = 0, False, b""
            async for raw in resp.content.iter_any():
                buffer += raw
                *events, buffer = buffer.split(b"\n\n")
                for event in events:
                    if event == b"data: [DONE]":
                        done = True
                    elif event.startswith(b"data: ") and b'"content":"' in event and b'"content":""' not in event:
                        chunks += 1
            word = "ok" if done and chunks == tokens else f"broken(done={done},chunks={chunks})"
            return word, time.monotonic() - started
    except (aiohttp.ClientError, TimeoutError) as exc:
        return f"error:{type(exc).__name__}", time.monotonic() - started


async def watch(stack: loopstack.Stack, stop: asyncio.Event, peaks: dict[str, float]) -> None:
    """Every 0.5 s: the gateway's RSS, fds and requests in flight; keeps the maxima."""
    while not stop.is_set():
        _, _, text = await asyncio.to_thread(loopstack.metrics_reading, stack.gateway_url)
        peaks["in_flight"] = max(peaks["in_flight"], loopstack.metric_sum(text, "gateway_requests_in_flight"))
        peaks["rss_kib"] = max(peaks["rss_kib"], loopstack.rss_kib(stack.pid))
        peaks["fds"] = max(peaks["fds"], loopstack.fd_count(stack.pid))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)


def reading(stack: loopstack.Stack) -> dict[str, Any]:
    size, series, text = loopstack.metrics_reading(stack.gateway_url)
    return {
        "rss_kib": loopstack.rss_kib(stack.pid),
        "fds": loopstack.fd_count(stack.pid),
        "in_flight": loopstack.metric_sum(text, "gateway_requests_in_flight"),
        "metrics_bytes": size,
        "series": series,
    }


async def drive(stack: loopstack.Stack, args: argparse.Namespace) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=args.timeout_s)
    peaks = {"in_flight": 0.0, "rss_kib": 0.0, "fds": 0.0}
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch(stack, stop, peaks))
    started = time.monotonic()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks = []
        for i in range(args.streams):
            tasks.append(asyncio.create_task(one_stream(session, stack.gateway_url, args.tokens, i)))
            await asyncio.sleep(args.ramp_s / args.streams)
        async with asyncio.timeout(args.timeout_s):
            results = await asyncio.gather(*tasks)
    wall = time.monotonic() - started
    stop.set()
    await watcher
    outcomes = collections.Counter(word for word, _ in results)
    durations = sorted(d for word, d in results if word == "ok")
    return {
        "outcomes": dict(outcomes),
        "errors": sum(v for k, v in outcomes.items() if k != "ok"),
        "wall_s": round(wall, 2),
        "stream_s": {
            "min": round(durations[0], 2) if durations else None,
            "median": round(statistics.median(durations), 2) if durations else None,
            "max": round(durations[-1], 2) if durations else None,
        },
        "peak": peaks,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--step-s", type=float, default=0.25, help="the simulators' decode step")
    parser.add_argument("--ramp-s", type=float, default=3.0)
    parser.add_argument("--max-in-flight", type=int, default=600, help="each backend's max_in_flight")
    parser.add_argument("--max-queue", type=int, default=1000, help="the gateway's limits.max_queue")
    parser.add_argument("--timeout-s", type=float, default=180.0)
    parser.add_argument("--rounds", type=int, default=2, help="rounds in the same gateway process")
    parser.add_argument("--out", type=Path, default=Path("/tmp/gateway-load"))
    args = parser.parse_args()
    params = {
        "preset": "fast",
        "max_batch": 1024,
        "base_step_s": args.step_s,
        "per_seq_step_s": 0.0,
        "kv_budget_tokens": 100_000_000,
        "default_max_tokens": args.tokens,
    }
    sections = {
        "limits": {"max_queue": args.max_queue, "queue_timeout_s": 60},
        "timeouts": {"keepalive_s": 15},
        "health": {"interval_s": 5, "timeout_s": 10, "scrape_interval_s": 5},
    }
    with loopstack.running_stack(args.out, 2, params, sections, args.max_in_flight) as stack:
        limit = loopstack.fd_limit(stack.pid)
        before = reading(stack)
        rounds = []
        for _ in range(args.rounds):
            result = asyncio.run(drive(stack, args))
            time.sleep(3)  # the clients' connections are closed; the upstream pool still holds idle ones
            result["after_3s"] = reading(stack)
            time.sleep(20)  # past aiohttp's keep-alive (15 s): the pool has closed its idle connections
            result["after_23s"] = reading(stack)
            rounds.append(result)
    report = {
        "streams": args.streams,
        "tokens_each": args.tokens,
        "step_s": args.step_s,
        "backends": 2,
        "max_in_flight_each": args.max_in_flight,
        "max_queue": args.max_queue,
        "gateway_rlimit_nofile": limit,
        "before": before,
        "rounds": rounds,
    }
    print(json.dumps(report, indent=2))
    (args.out / "summary.json").write_text(json.dumps(report, indent=2))
    return 0 if all(r["errors"] == 0 for r in rounds) else 1


if __name__ == "__main__":
    sys.exit(main())
