"""Soak: mixed traffic through one gateway process for --minutes, sampling the process every minute.

The stack (benchmarks/loopstack.py): two simulated vLLM engines (a simulator, not a real engine;
preset ``fast``) in one process, `gateway serve` in another, on loopback. The client sends an open-loop
load of --rate requests/s (at most --concurrency at once): chat streamed 40 %, chat 25 %, completions
20 % (half streamed), embeddings 15 %. Of them, --disconnect (5 %) are abandoned by the client (a stream
after its first chunk, a plain request 0-50 ms after it was sent) and --upstream-errors (2 %) carry an
``x-sim-fault`` that makes the engine fail (500, 503, or a stream that dies with a reset after one chunk).

Every minute: the gateway's RSS, open fds, the size of /metrics in bytes and its number of series
(sample lines), and the requests in flight. At the end, with the load stopped and the stack idle, one
more sample; then a least-squares slope of each over the second half of the run: a plateau has a
slope near zero there, a leak keeps its slope. With --tracemalloc the gateway runs under tracemalloc
(benchmarks/traced_gateway.py; slower, so it is for finding a cause, not for the figures) and the
biggest growths between the middle and the end are printed. With --trim each sample also asks the
gateway to malloc_trim(0) and reads its RSS after: memory glibc holds but nothing uses comes back, so
that line follows what is live.

    PYTHONPATH=$PWD python3 benchmarks/soak.py --minutes 30 --out /tmp/soak

A clean request (no fault, no disconnect) that does not end with 200 and a whole answer is a failure;
the run exits 1 if there is one, or if the second-half RSS slope projects more than 5 % growth per hour.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import signal
import sys
import time
import tracemalloc
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loopstack

KINDS = (("chat_stream", 40), ("chat", 25), ("completions_stream", 10), ("completions", 10), ("embeddings", 15))
FAULTS = ("status=500", "status=503", "die_after=1;die=rst")
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "tired",
    "engines",
    "decode",
    "tokens",
    "in",
    "batches",
]
SYSTEM = "You are a careful assistant. " * 8


@dataclass
class Sample:
    minute: float
    rss_kib: int
    fds: int
    metrics_bytes: int
    series: int
    in_flight: float
    sent: int
    rss_trimmed_kib: int | None = None  # with --trim: RSS right after malloc_trim(0)


@dataclass
class Plan:
    kind: str
    fault: str | None
    disconnect: bool


def body_for(kind: str, rng: random.Random) -> tuple[str, dict[str, Any]]:
    text = " ".join(rng.choices(WORDS, k=rng.randint(4, 40)))
    if kind.startswith("chat"):
        messages = [{"role": "user", "content": text}]
        if rng.random() < 0.3:
            messages.insert(0, {"role": "system", "content": SYSTEM})
        body: dict[str, Any] = {"model": loopstack.MODEL, "messages": messages, "max_tokens": rng.randint(4, 24)}
        if kind == "chat_stream":
            body["stream"] = True
        return "/v1/chat/completions", body
    if kind.startswith("completions"):
        body = {"model": loopstack.MODEL, "prompt": text, "max_tokens": rng.randint(4, 24)}
        if kind == "completions_stream":
            body["stream"] = True
        return "/v1/completions", body
    return "/v1/embeddings", {"model": loopstack.MODEL, "input": text}


async def one_request(session: aiohttp.ClientSession, url: str, plan: Plan, rng: random.Random) -> str:
    """Send one request as planned; the outcome as a short word: ok, status:N, broken, left, error:..."""
    path, body = body_for(plan.kind, rng)
    headers = {"x-sim-fault": plan.fault} if plan.fault else {}
    stream = bool(body.get("stream"))
    try:
        if plan.disconnect and not stream:
            try:
                async with asyncio.timeout(rng.uniform(0, 0.05)):
                    async with session.post(url + path, json=body, headers=headers) as resp:
                        await resp.read()
                        return "ok" if resp.status == 200 else f"status:{resp.status}"
            except TimeoutError:
                return "left"
        async with session.post(url + path, json=body, headers=headers) as resp:
            if resp.status != 200:
                await resp.read()
                return f"status:{resp.status}"
            if not stream:
                data = await resp.json()
                return "ok" if data.get("object") else "broken"
            tail = b""
            async for chunk in resp.content.iter_any():
                if plan.disconnect:
                    resp.close()  # the client leaves after the first chunk
                    return "left"
                tail = (tail + chunk)[-64:]
            return "ok" if b"data: [DONE]" in tail else "broken"
    except (aiohttp.ClientError, asyncio.IncompleteReadError) as exc:
        return f"error:{type(exc).__name__}"


def trimmed_rss(stack: loopstack.Stack) -> int | None:
    """Ask the gateway (benchmarks/traced_gateway.py) to malloc_trim(0); its RSS after that, KiB."""
    trim = stack.workdir / "trim.txt"
    lines = len(trim.read_text().splitlines()) if trim.exists() else 0
    os.kill(stack.pid, signal.SIGUSR2)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if trim.exists() and len(done := trim.read_text().splitlines()) > lines:
            return int(done[-1].split()[1])
        time.sleep(0.05)
    return None


def sample(stack: loopstack.Stack, started: float, sent: int, trim: bool) -> Sample:
    size, series, text = loopstack.metrics_reading(stack.gateway_url)
    return Sample(
        minute=round((time.monotonic() - started) / 60, 2),
        rss_kib=loopstack.rss_kib(stack.pid),
        fds=loopstack.fd_count(stack.pid),
        metrics_bytes=size,
        series=series,
        in_flight=loopstack.metric_sum(text, "gateway_requests_in_flight"),
        sent=sent,
        rss_trimmed_kib=trimmed_rss(stack) if trim else None,
    )


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y over x."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    den = sum((x - mx) ** 2 for x, _ in points)
    return 0.0 if den == 0 else sum((x - mx) * (y - my) for x, y in points) / den


async def drive(stack: loopstack.Stack, args: argparse.Namespace, samples: list[Sample]) -> collections.Counter[str]:
    rng = random.Random(args.seed)
    outcomes: collections.Counter[str] = collections.Counter()
    limit = asyncio.Semaphore(args.concurrency)
    tasks: set[asyncio.Task[None]] = set()
    started = time.monotonic()
    end = started + args.minutes * 60
    next_sample = started
    sent = 0
    kinds, weights = zip(*KINDS, strict=True)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=60)
    log = (args.out / "samples.jsonl").open("w")

    def record(s: Sample) -> None:
        samples.append(s)
        log.write(json.dumps(asdict(s)) + "\n")
        log.flush()
        print(
            f"min {s.minute:6.2f}  rss {s.rss_kib / 1024:7.1f} MiB  fds {s.fds:4d}  /metrics {s.metrics_bytes:7d} B"
            f"  series {s.series:5d}  in_flight {s.in_flight:3.0f}  sent {s.sent}"
            + (f"  rss after trim {s.rss_trimmed_kib / 1024:7.1f} MiB" if s.rss_trimmed_kib else ""),
            flush=True,
        )
        if args.tracemalloc:
            os.kill(stack.pid, signal.SIGUSR1)

    async def run_one(plan: Plan, seed: int) -> None:
        try:
            word = await one_request(session, stack.gateway_url, plan, random.Random(seed))
        finally:
            limit.release()
        clean = plan.fault is None and not plan.disconnect
        outcomes[f"{plan.kind} {'clean' if clean else 'fault' if plan.fault else 'disconnect'} {word}"] += 1

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        while (now := time.monotonic()) < end:
            if now >= next_sample:
                record(sample(stack, started, sent, args.trim))
                next_sample += args.sample_s
            await asyncio.sleep(rng.expovariate(args.rate))
            if limit.locked():
                outcomes["skipped (client at --concurrency)"] += 1
                continue
            await limit.acquire()
            kind = rng.choices(kinds, weights)[0]
            fault = rng.choice(FAULTS) if rng.random() < args.upstream_errors else None
            if fault == "die_after=1;die=rst" and not kind.endswith("stream"):
                fault = "status=500"
            plan = Plan(kind, fault, disconnect=fault is None and rng.random() < args.disconnect)
            task = asyncio.create_task(run_one(plan, rng.getrandbits(32)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            sent += 1
        if tasks:
            await asyncio.wait(tasks)
    # idle: the engines' aborts and the gateway's cleanup have a moment to finish
    await asyncio.sleep(3)
    record(sample(stack, started, sent, args.trim))
    log.close()
    return outcomes


def summarise(samples: list[Sample], minutes: float) -> dict[str, Any]:
    half = [s for s in samples if s.minute >= minutes / 2]
    out: dict[str, Any] = {"first": asdict(samples[0]), "last": asdict(samples[-1])}
    fields = ["rss_kib", "fds", "metrics_bytes", "series"]
    if samples[0].rss_trimmed_kib is not None:
        fields.append("rss_trimmed_kib")
    for field in fields:
        out[f"{field}_slope_per_min_second_half"] = round(slope([(s.minute, getattr(s, field) or 0) for s in half]), 3)
        out[f"{field}_max"] = max(getattr(s, field) or 0 for s in samples)
    mean_rss = sum(s.rss_kib for s in half) / max(len(half), 1)
    out["rss_growth_pct_per_hour_projected"] = round(100 * 60 * out["rss_kib_slope_per_min_second_half"] / mean_rss, 2)
    return out


def tracemalloc_report(folder: Path, top: int = 15) -> str:
    snaps = sorted(folder.glob("snapshot-*.pickle"), key=lambda p: int(p.stem.split("-")[1]))
    if len(snaps) < 3:
        return "tracemalloc: too few snapshots"
    mid = tracemalloc.Snapshot.load(str(snaps[len(snaps) // 2]))
    last = tracemalloc.Snapshot.load(str(snaps[-1]))
    lines = [f"tracemalloc: {snaps[len(snaps) // 2].name} -> {snaps[-1].name}, biggest growths by line:"]
    for stat in last.compare_to(mid, "lineno")[:top]:
        lines.append(f"  {stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks  {stat.traceback[0]}")
    lines.append("by traceback (top 3):")
    for stat in last.compare_to(mid, "traceback")[:3]:
        lines.append(f"  {stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks")
        lines.extend(f"      {frame}" for frame in stat.traceback.format()[-12:])
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=30.0, help="requests per second (open loop)")
    parser.add_argument("--concurrency", type=int, default=200, help="most requests the client has open")
    parser.add_argument("--disconnect", type=float, default=0.05)
    parser.add_argument("--upstream-errors", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--sample-s", type=float, default=60.0, help="seconds between samples")
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("--trim", action="store_true", help="also sample RSS right after malloc_trim(0)")
    parser.add_argument("--collect", action="store_true", help="with --trim: gc.collect() before the trim")
    parser.add_argument("--out", type=Path, default=Path("/tmp/gateway-soak"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for old in [*args.out.glob("snapshot-*.pickle"), *args.out.glob("trim.txt")]:
        old.unlink()
    sections = {
        "limits": {"max_queue": 200, "queue_timeout_s": 10},
        "health": {"interval_s": 5, "scrape_interval_s": 5},
    }
    argv = None
    if args.tracemalloc or args.trim:
        os.environ["TRACED_GATEWAY_DIR"] = str(args.out)
        os.environ["TRACED_GATEWAY_TRACEMALLOC"] = "1" if args.tracemalloc else "0"
        os.environ["TRACED_GATEWAY_COLLECT"] = "1" if args.collect else "0"
        argv = [sys.executable, str(Path(__file__).resolve().parent / "traced_gateway.py")]
    samples: list[Sample] = []
    with loopstack.running_stack(args.out, 2, {"preset": "fast"}, sections, 64, argv) as stack:
        print(f"gateway pid {stack.pid} at {stack.gateway_url}; RLIMIT_NOFILE {loopstack.fd_limit(stack.pid)}")
        outcomes = asyncio.run(drive(stack, args, samples))
        time.sleep(1)
    summary = summarise(samples, args.minutes)
    failures = {k: v for k, v in outcomes.items() if " clean " in k and not k.endswith(" ok")}
    five_xx_clean = sum(v for k, v in failures.items() if k.split()[-1].startswith("status:5"))
    report = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "outcomes": dict(sorted(outcomes.items())),
        "clean_failures": failures,
        "clean_5xx": five_xx_clean,
        **summary,
    }
    (args.out / "summary.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    if args.tracemalloc:
        text = tracemalloc_report(args.out)
        (args.out / "tracemalloc.txt").write_text(text)
        print(text)
    leak = summary["rss_growth_pct_per_hour_projected"] > 5 or summary["series_slope_per_min_second_half"] > 0.5
    print("verdict:", "GROWING (see the slopes)" if leak else "plateau", "; clean failures:", sum(failures.values()))
    return 1 if failures or leak else 0


if __name__ == "__main__":
    sys.exit(main())
