"""Backend isolation: a healthy route's latency, and the gateway's event-loop lag, with and without a
hostile backend beside it, in one run (docs/reliability.md, "Backend isolation").

The gateway (`gateway serve`) runs as its own process in front of two simulators in another: route
``tiny`` on a healthy one, route ``bad`` on one that every hostile request asks to misbehave: one
50 MB ``data:`` line (cut by limits.max_event_bytes), a stream dripped one byte a write, a reset
after two chunks, garbage lines. A prober sends a small chat request to ``tiny`` every
``--interval`` seconds, and another GETs /healthz as often: its latency is the loop lag the
gateway's other requests see (an upper bound: loopback and the HTTP exchange are in it too); the
gateway's own measure of it, gateway_event_loop_lag_seconds, is read from /metrics around each
phase (the p99 and the max, to its bucket bounds). The
hostile simulator gets the first CPU, at nice 10, and everything else the others (benchmarks/cpus.py).

    PYTHONPATH=$PWD python3 benchmarks/isolation.py --quiet-s 20 --hostile-s 20

It prints the figures and writes them, with the date, machine, commit and argv, to
benchmarks/results/isolation-<UTC time>.json."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.cpus import isolate_engine
from benchmarks.loopstack import REPO, running_stack

HOSTILE = {
    "huge_event": "huge_event=50000000",
    "drip": "split=1;tokens=40",
    "reset": "die_after=2;die=rst",
    "garbage": "garbage=1",
}


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _probe(
    client: httpx.AsyncClient, url: str, interval: float, stop: asyncio.Event, chat: bool
) -> dict[str, Any]:
    """One request every `interval` s until `stop`: the latencies (s) and the failures."""
    times: list[float] = []
    failures = 0
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    while not stop.is_set():
        start = time.perf_counter()
        try:
            if chat:
                r = await client.post(url + "/v1/chat/completions", json=body)
            else:
                r = await client.get(url + "/healthz")
            ok = r.status_code == 200
        except httpx.HTTPError:
            ok = False
        elapsed = time.perf_counter() - start
        times.append(elapsed)
        failures += not ok
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, interval - elapsed))
    return {"times": times, "failures": failures}


async def _hostile(client: httpx.AsyncClient, url: str, fault: str, sent: list[int], i: int) -> None:
    """Streams on route `bad` with one fault, one after another until cancelled; `sent[i]` counts them."""
    body = {"model": "bad", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "stream": True}
    while True:
        sent[i] += 1
        with contextlib.suppress(httpx.HTTPError):
            async with client.stream(
                "POST", url + "/v1/chat/completions", json=body, headers={"x-sim-fault": fault}
            ) as r:
                async for _ in r.aiter_raw():
                    pass


async def _hostile_clients(url: str, seconds: float, faults: list[str]) -> list[int]:
    sent = [0] * len(faults)
    async with httpx.AsyncClient(timeout=30) as client:
        tasks = [asyncio.create_task(_hostile(client, url, HOSTILE[f], sent, i)) for i, f in enumerate(faults)]
        await asyncio.sleep(seconds)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return sent


async def _phase(
    url: str, seconds: float, interval: float, hostile: subprocess.Popen[str] | None, faults: list[str]
) -> dict[str, Any]:
    stop = asyncio.Event()
    async with httpx.AsyncClient(timeout=30) as client:
        probes = [
            asyncio.create_task(_probe(client, url, interval, stop, chat=True)),
            asyncio.create_task(_probe(client, url, interval, stop, chat=False)),
        ]
        await asyncio.sleep(seconds)
        stop.set()
        chat, health = await asyncio.gather(*probes)
    sent: list[int] = []
    if hostile is not None:
        out, _ = hostile.communicate(timeout=60)
        sent = json.loads(out.strip().splitlines()[-1])
    return {
        "healthy_requests": len(chat["times"]),
        "healthy_failures": chat["failures"],
        "healthy_p50_ms": round(quantile(chat["times"], 0.5) * 1e3, 2),
        "healthy_p99_ms": round(quantile(chat["times"], 0.99) * 1e3, 2),
        "healthz_p99_ms": round(quantile(health["times"], 0.99) * 1e3, 2),
        "loop_lag_max_ms": round(max(health["times"], default=float("nan")) * 1e3, 2),
        "healthz_failures": health["failures"],
        "hostile_requests": dict(zip(faults, sent, strict=True)) if sent else {},
    }


def gateway_durations(log: Path, start: int) -> tuple[list[float], int]:
    """The healthy route's request durations by the gateway's own clock (its access log: from the
    request's first byte parsed to its last byte sent), from byte `start` of the log on; and where
    the log ends now."""
    text = log.read_bytes()
    times = []
    for line in text[start:].decode("utf-8", "replace").splitlines():
        if " route=tiny " in line and " duration=" in line:
            times.append(float(line.split(" duration=", 1)[1].split(" ", 1)[0]))
    return times, len(text)


LAG = "gateway_event_loop_lag_seconds_bucket"


def loop_lag_buckets(url: str) -> dict[float, float]:
    """The gateway's own loop-lag histogram now (gateway_event_loop_lag_seconds: how late a timer due
    every 100 ms ran), cumulative counts by upper bound."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=10).text
    out: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == LAG:
                out[float(sample.labels["le"])] = sample.value
    return out


def lag_figures(before: dict[float, float], after: dict[float, float]) -> dict[str, Any]:
    """The phase's ticks (the difference of two readings): how many, the bucket bound that 99 % of
    them were under, and the bound of the latest bucket any reached (the max, to a bucket)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    p99 = next((b for b, c in zip(bounds, counts, strict=True) if c >= 0.99 * total), float("nan"))
    below = [0.0, *counts[:-1]]
    reached = [b for b, c, prev in zip(bounds, counts, below, strict=True) if c > prev]
    top = reached[-1] if reached else float("nan")
    return {"lag_ticks": int(total), "lag_p99_under_ms": p99 * 1e3, "lag_max_under_ms": top * 1e3}


def cpu_s(pid: int) -> float:
    """The process's user + system CPU time so far, from /proc (seconds)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(
    quiet_s: float,
    hostile_s: float,
    interval: float,
    workdir: Path,
    faults: list[str],
    max_event_bytes: int | None = None,
) -> dict[str, Any]:
    """Both phases against one stack: quiet first, then with the hostile backend busy
    (`max_event_bytes`: limits.max_event_bytes, when not the default)."""
    sections: dict[str, Any] = {
        # The hostile backend must stay in the pool to keep misbehaving: no passive ejection.
        "health": {"interval_s": 60, "scrape_interval_s": 60, "unhealthy_after": 1_000_000},
        "retry": {"max_attempts": 1},
    }
    if max_event_bytes is not None:
        sections["limits"] = {"max_event_bytes": max_event_bytes}
    routes = [{"model": "tiny", "pools": ["good"]}, {"model": "bad", "pools": ["bad"]}]
    with running_stack(workdir, 2, {}, sections, routes=routes, pool_of=["good", "bad"]) as stack:
        # The hostile engine stands for another machine: a core of its own at low priority, so that its
        # own CPU (a 50 MB event to build, a byte a write) is not what the healthy route waits for.
        before = isolate_engine(stack.sim_pids[1])
        for pid in (stack.gateway.pid, stack.sim_pids[0]):
            os.sched_setaffinity(pid, before - {min(before)} or before)
        log = stack.workdir / "gateway.log"
        _, mark = gateway_durations(log, 0)
        start = cpu_s(stack.gateway.pid)
        lag = loop_lag_buckets(stack.gateway_url)
        quiet = asyncio.run(_phase(stack.gateway_url, quiet_s, interval, None, faults))
        after_quiet = loop_lag_buckets(stack.gateway_url)
        quiet.update(lag_figures(lag, after_quiet))
        lag = after_quiet
        quiet["gateway_cpu_share"] = round((cpu_s(stack.gateway.pid) - start) / quiet_s, 3)
        own, mark = gateway_durations(log, mark)
        quiet["gateway_p50_ms"] = round(quantile(own, 0.5) * 1e3, 2)
        quiet["gateway_p99_ms"] = round(quantile(own, 0.99) * 1e3, 2)
        start = cpu_s(stack.gateway.pid)
        # The hostile clients are another machine's too: their own process, at low priority.
        argv = [sys.executable, __file__, "--hostile-client", stack.gateway_url, "--hostile-s", str(hostile_s)]
        argv += ["--faults", ",".join(faults)]
        clients = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=REPO, start_new_session=True)
        # On the hostile engine's core: reading 2 MiB streams in Python is CPU that another machine
        # would spend; beside the gateway it is the kernel's scheduling that the probe measures.
        os.sched_setaffinity(clients.pid, {min(before)})
        os.setpriority(os.PRIO_PROCESS, clients.pid, 10)
        hostile = asyncio.run(_phase(stack.gateway_url, hostile_s, interval, clients, faults))
        hostile.update(lag_figures(lag, loop_lag_buckets(stack.gateway_url)))
        hostile["gateway_cpu_share"] = round((cpu_s(stack.gateway.pid) - start) / hostile_s, 3)
        own, mark = gateway_durations(log, mark)
        hostile["gateway_p50_ms"] = round(quantile(own, 0.5) * 1e3, 2)
        hostile["gateway_p99_ms"] = round(quantile(own, 0.99) * 1e3, 2)
    ratio = round(hostile["healthy_p99_ms"] / quiet["healthy_p99_ms"], 2)
    own_ratio = round(hostile["gateway_p99_ms"] / quiet["gateway_p99_ms"], 2)
    return {"quiet": quiet, "hostile": hostile, "p99_ratio": ratio, "gateway_p99_ratio": own_ratio}


def _commit() -> str:
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        return subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=REPO, text=True).strip()
    return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quiet-s", type=float, default=20.0)
    parser.add_argument("--hostile-s", type=float, default=20.0)
    parser.add_argument("--interval", type=float, default=0.02, help="seconds between two probes of each kind")
    parser.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--faults", default=",".join(HOSTILE), help="hostile kinds, of: " + ", ".join(HOSTILE))
    parser.add_argument("--max-event-bytes", type=int, help="limits.max_event_bytes (default: the gateway's)")
    parser.add_argument("--hostile-client", metavar="URL", help=argparse.SUPPRESS)  # the hostile clients' process
    args = parser.parse_args()
    faults = [f for f in args.faults.split(",") if f]
    if args.hostile_client:
        print(json.dumps(asyncio.run(_hostile_clients(args.hostile_client, args.hostile_s, faults))), flush=True)
        return
    with tempfile.TemporaryDirectory() as tmp:
        figures = measure(args.quiet_s, args.hostile_s, args.interval, Path(tmp), faults, args.max_event_bytes)
    now = datetime.datetime.now(datetime.UTC)
    result = {
        "benchmark": "isolation",
        "date": now.isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "commit": _commit(),
        "argv": sys.argv,
        "figures": figures,
    }
    for phase in ("quiet", "hostile"):
        f = figures[phase]
        print(
            f"{phase:8} healthy p50 {f['healthy_p50_ms']} ms, p99 {f['healthy_p99_ms']} ms,"
            f" failures {f['healthy_failures']}/{f['healthy_requests']}; /healthz p99 {f['healthz_p99_ms']} ms,"
            f" max {f['loop_lag_max_ms']} ms; by the gateway's clock p50 {f['gateway_p50_ms']} ms, p99"
            f" {f['gateway_p99_ms']} ms; gateway CPU {f['gateway_cpu_share']:.0%}; hostile {f['hostile_requests']};"
            f" the gateway's loop lag (gateway_event_loop_lag_seconds, {f['lag_ticks']} ticks): p99 under"
            f" {f['lag_p99_under_ms']:g} ms, max under {f['lag_max_under_ms']:g} ms"
        )
    ratios = f"{figures['p99_ratio']} at the client, {figures['gateway_p99_ratio']} by the gateway"
    print(f"p99 ratio (hostile / quiet): {ratios}")
    args.results.mkdir(parents=True, exist_ok=True)
    path = args.results / f"isolation-{now.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
