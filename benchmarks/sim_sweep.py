"""Concurrency sweep against one in-process vLLM-flavour SimServer ("seed" preset), over real sockets.

Prints the median per-request tok/s and the aggregate tok/s at each concurrency, and checks them against
the measured real setup (1 stream: 11.3 tok/s; 32 streams: 5.6 tok/s each, 179.9 tok/s together).

    python benchmarks/sim_sweep.py [--tokens 64] [--levels 1,4,16,32]

Per-request tok/s is (completion tokens - 1) / (last token time - first token time), the decode speed a
user sees; aggregate tok/s is all completion tokens / wall time from the first request to the last token.
Exit status 1 when a checked figure is more than 10% off.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from engines.sim.server import SimParams, SimServer

TARGETS = {1: (11.3, None), 32: (5.6, 179.9)}  # concurrency -> (per-request tok/s, aggregate tok/s)
TOLERANCE = 0.10


@dataclass
class Level:
    concurrency: int
    per_request: float  # median tok/s of one stream
    aggregate: float
    ttft: float  # median seconds to the first token


async def one_stream(client: httpx.AsyncClient, tokens: int, i: int) -> tuple[float, float, float, int]:
    """(start, first token time, last token time, completion tokens) of one streamed request."""
    body = {"model": "tiny", "max_tokens": tokens, "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": f"request {i}: tell me something"}]}  # fmt: skip
    start = time.monotonic()
    first = last = 0.0
    count = 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event["choices"] and event["choices"][0]["delta"].get("content"):
                last = time.monotonic()
                first = first or last
            if event.get("usage"):
                count = event["usage"]["completion_tokens"]
    return start, first, last, count


async def run_level(client: httpx.AsyncClient, concurrency: int, tokens: int) -> Level:
    results = await asyncio.gather(*(one_stream(client, tokens, i) for i in range(concurrency)))
    begin = min(r[0] for r in results)
    end = max(r[2] for r in results)
    per_request = [(n - 1) / (last - first) for _, first, last, n in results]
    return Level(
        concurrency=concurrency,
        per_request=statistics.median(per_request),
        aggregate=sum(r[3] for r in results) / (end - begin),
        ttft=statistics.median(first - start for start, first, _, _ in results),
    )


def check(levels: list[Level]) -> list[str]:
    """The figures that are more than TOLERANCE off their targets."""
    failures = []
    for level in levels:
        per_request, aggregate = TARGETS.get(level.concurrency, (None, None))
        for name, got, want in (("per-request", level.per_request, per_request),
                                ("aggregate", level.aggregate, aggregate)):  # fmt: skip
            if want is not None and abs(got - want) > TOLERANCE * want:
                failures.append(f"{level.concurrency} streams: {name} {got:.1f} tok/s, expected {want} ±10%")
    return failures


async def sweep(levels: list[int], tokens: int) -> list[Level]:
    out = []
    async with SimServer(SimParams.preset("seed")) as server:
        limits = httpx.Limits(max_connections=max(levels), max_keepalive_connections=max(levels))
        async with httpx.AsyncClient(base_url=server.base_url, limits=limits, timeout=120.0) as client:
            for n in levels:
                out.append(await run_level(client, n, tokens))
                print(f"{n:>11} {out[-1].per_request:>22.2f} {out[-1].aggregate:>18.1f} {out[-1].ttft:>11.3f}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64, help="completion tokens per request")
    parser.add_argument("--levels", default="1,4,16,32", help="comma-separated concurrencies")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    print(f"sim 'seed' preset, vLLM flavour, {args.tokens} tokens per request")
    print(f"{'concurrency':>11} {'per-request tok/s (med)':>22} {'aggregate tok/s':>18} {'TTFT (med)':>11}")
    started = time.monotonic()
    failures = check(asyncio.run(sweep(levels, args.tokens)))
    print(f"took {time.monotonic() - started:.1f} s")
    for failure in failures:
        print("FAIL:", failure)
    if not failures:
        print("OK: within 10% of the measured setup (11.3 tok/s at 1; 5.6 and 179.9 tok/s at 32)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
