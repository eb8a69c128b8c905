"""Python load clients for what wrk can't do (aiohttp on uvloop; run pinned to the load core).

    python loadgen.py paced   --url URL --body FILE --rate 200 --duration 10 [--pair-url URL] [--direct-url URL]
        Open loop at a fixed rate: request i is sent at t0 + i/rate whatever the earlier ones did, on
        a pool of keep-alive connections. Latency is send -> last body byte. With --pair-url (another
        proxy) and --direct-url (the upstream itself), the same schedule is sent to those too, each
        request's copies spread evenly over its period, each target on its own pool: `pair_p50_ms`
        and `direct_p50_ms` then come from the same seconds as `p50_ms`, so a drift of the machine's
        wake-up latency moves them all alike. Prints one JSON line.
    python loadgen.py streams --url URL --body FILE --concurrency 100 --rounds 5
        `concurrency` workers, each running `rounds` streams back to back (so `concurrency` streams
        are in flight throughout). Per stream: time to the first event, time to [DONE], events seen.
    python loadgen.py check   --url URL --body FILE
        One request; prints status, headers of interest and the number of SSE events (a sanity check).

Every loop is bounded by count and by time."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from typing import Any

import aiohttp


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = min(len(s) - 1, max(0, round(p / 100 * len(s) + 0.5) - 1))
    return s[k]


def _session(limit: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit, force_close=False, enable_cleanup_closed=False),
        timeout=aiohttp.ClientTimeout(total=60),
        skip_auto_headers=("User-Agent",),
        auto_decompress=False,
    )


async def paced(
    url: str,
    body: bytes,
    rate: float,
    duration: float,
    connections: int,
    direct_url: str | None = None,
    pair_url: str | None = None,
) -> dict[str, Any]:
    headers = {"content-type": "application/json"}
    # The peer first in each period, then the pair (another proxy), then the upstream itself, spread
    # evenly over the period, each on its own pool of connections.
    targets = [(url, "")] + [(u, k) for u, k in ((pair_url, "pair_"), (direct_url, "direct_")) if u is not None]
    latencies: dict[str, list[float]] = {key: [] for _, key in targets}
    late: list[float] = []
    errors: dict[str, int] = {}
    statuses: dict[int, int] = {}
    async with contextlib.AsyncExitStack() as stack:
        sessions = [await stack.enter_async_context(_session(connections)) for _ in targets]
        # Warm the connection pools so that connect time isn't in the first samples.
        for session, (target, _) in zip(sessions, targets, strict=True):
            await asyncio.gather(*(one(session, target, body, headers) for _ in range(min(connections, 16))))
        total = int(rate * duration)
        loop = asyncio.get_running_loop()
        t0 = loop.time() + 0.05
        tasks = []

        async def fire(to: aiohttp.ClientSession, target: str, due: float, key: str) -> None:
            """One request sent at `due`; its latency into its target's list (the peer's also keeps the
            lateness and the statuses)."""
            if not key:
                late.append(loop.time() - due)
            start = time.perf_counter()
            try:
                status = await one(to, target, body, headers)
            except (TimeoutError, aiohttp.ClientError, OSError):
                errors[key] = errors.get(key, 0) + 1
                return
            if not key:
                statuses[status] = statuses.get(status, 0) + 1
            if status == 200:
                latencies[key].append(time.perf_counter() - start)
            else:
                errors[key] = errors.get(key, 0) + 1

        for i in range(total):
            for j, (session, (target, key)) in enumerate(zip(sessions, targets, strict=True)):
                due = t0 + (i + j / len(targets)) / rate
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                tasks.append(asyncio.create_task(fire(session, target, due, key)))
        wall = loop.time() - t0
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
    mine = latencies[""]
    out: dict[str, Any] = {
        "sent": total,
        "ok": len(mine),
        "errors": errors.get("", 0),
        "statuses": statuses,
        "rate": round(total / wall, 1) if wall > 0 else None,
        "p50_ms": pct(mine, 50) * 1e3,
        "p90_ms": pct(mine, 90) * 1e3,
        "p99_ms": pct(mine, 99) * 1e3,
        "max_ms": max(mine) * 1e3 if mine else None,
        "mean_ms": sum(mine) / len(mine) * 1e3 if mine else None,
        "late_p99_ms": pct(late, 99) * 1e3,
    }
    for _, key in targets[1:]:
        out[f"{key}p50_ms"] = pct(latencies[key], 50) * 1e3
        out[f"{key}errors"] = errors.get(key, 0)
    return out


async def one(session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]) -> int:
    async with session.post(url, data=body, headers=headers) as resp:
        await resp.read()
        return resp.status


async def one_stream(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[float, float, int, bool]:
    """(time to first event, total time, events, saw [DONE]) for one streamed completion."""
    start = time.perf_counter()
    first = 0.0
    events = 0
    done = False
    carry = b""
    async with session.post(url, data=body, headers={"content-type": "application/json"}) as resp:
        if resp.status != 200:
            await resp.read()
            raise RuntimeError(f"status {resp.status}")
        async for chunk in resp.content.iter_any():
            data = carry + chunk
            parts = data.split(b"\n\n")
            carry = parts.pop()
            for part in parts:
                if part.startswith(b"data: "):
                    if part == b"data: [DONE]":
                        done = True
                    else:
                        events += 1
                        if events == 1:
                            first = time.perf_counter() - start
    return first, time.perf_counter() - start, events, done


async def streams(
    url: str, body: bytes, concurrency: int, rounds: int, stagger_s: float, deadline_s: float
) -> dict[str, Any]:
    times: list[float] = []
    firsts: list[float] = []
    event_counts: list[int] = []
    failures: list[str] = []
    async with _session(concurrency + 8) as session:

        async def worker(k: int) -> None:
            await asyncio.sleep(stagger_s * k / concurrency)
            for _ in range(rounds):
                try:
                    first, total, events, done = await one_stream(session, url, body)
                except (TimeoutError, aiohttp.ClientError, OSError, RuntimeError) as exc:
                    failures.append(type(exc).__name__ + ": " + str(exc))
                    continue
                if not done:
                    failures.append("no [DONE]")
                    continue
                times.append(total)
                firsts.append(first)
                event_counts.append(events)

        t0 = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(worker(k) for k in range(concurrency))), timeout=deadline_s)
        wall = time.perf_counter() - t0
    return {
        "streams": len(times),
        "failures": len(failures),
        "failure_examples": failures[:3],
        "events": sum(event_counts),
        "events_per_stream_min": min(event_counts) if event_counts else 0,
        "wall_s": wall,
        "p50_s": pct(times, 50),
        "p99_s": pct(times, 99),
        "max_s": max(times) if times else None,
        "ttft_p50_ms": pct(firsts, 50) * 1e3,
        "ttft_p99_ms": pct(firsts, 99) * 1e3,
    }


async def check(url: str, body: bytes) -> dict[str, Any]:
    headers = {"content-type": "application/json"}
    async with _session(1) as session, session.post(url, data=body, headers=headers) as resp:
        raw = await resp.read()
        return {
            "status": resp.status,
            "content_type": resp.headers.get("content-type"),
            "backend": resp.headers.get("x-gateway-backend"),
            "bytes": len(raw),
            "events": raw.count(b"data: "),
            "done": raw.rstrip().endswith(b"data: [DONE]"),
        }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["paced", "streams", "check"])
    p.add_argument("--url", required=True)
    p.add_argument("--body", required=True, help="a file with the JSON request body")
    p.add_argument("--rate", type=float, default=200)
    p.add_argument("--duration", type=float, default=10)
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=100)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--stagger-ms", type=float, default=20)
    p.add_argument("--deadline", type=float, default=120)
    p.add_argument("--direct-url", default=None, help="paced: the same schedule to this URL too (the upstream)")
    p.add_argument("--pair-url", default=None, help="paced: and to this one (another proxy, for a paired ratio)")
    a = p.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    with open(a.body, "rb") as f:
        body = f.read()
    if a.mode == "paced":
        out = asyncio.run(paced(a.url, body, a.rate, a.duration, a.connections, a.direct_url, a.pair_url))
    elif a.mode == "streams":
        out = asyncio.run(streams(a.url, body, a.concurrency, a.rounds, a.stagger_ms / 1e3, a.deadline))
    else:
        out = asyncio.run(check(a.url, body))
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
