"""Metric truth: do the gateway's metrics, as a real Prometheus sees them, agree with what the
client measured and with what the engine counted?

The stack: a REAL vLLM (CPU build, the tiny generated model of tests/engines/setup.sh, one replica,
max_num_seqs 16, max_model_len 4096), the gateway as its own process (`gateway serve`) in front of
it, and a real Prometheus (Debian's binary) scraping the gateway every second with the deploy rules
loaded. At each concurrency (1, 4, 16, 32 by default) that many aiohttp clients send streamed chat
completions one after another (~2,700-token prompts that share no prefix, `ignore_eos`,
`max_tokens` 32, `stream_options.include_usage`) for `--duration` seconds (at most
`--max-requests` each; a request already sent is finished). Between levels the engine goes idle
and two scrapes pass, so every level has a clean before and after.

vLLM gets CPU 0 to itself (all its threads, nice 10) and the client, the gateway and Prometheus the
other CPUs: sharing cores with a decoding vLLM, they were descheduled for tens to hundreds of
milliseconds at a time, which lands in their timings (see isolate_engine).

Per level it compares:
  (a) TTFT, inter-token latency (ITL), end-to-end time and per-request tok/s. The client measures
      from just before it sends the request to each chunk with content: the first is its TTFT, the
      gaps between them its ITL, the end of the stream its e2e, and (completion tokens - 1) / (last
      content chunk - first) its tok/s, as the gateway defines it. The gateway measures from the
      request's arrival to the content chunks it receives from vLLM, and to its last byte written,
      so the client's clock also holds the loopback and the HTTP client at both ends.
      - mean: Δ_sum / Δ_count of the gateway's histograms, read from Prometheus at two instants
        (exact: no interpolation, no extrapolation);
      - p50 and p95 (and p10 for tok/s): the Grafana dashboard's own panel expression for that
        histogram, with every route and pool selected and $__rate_interval = the level's window,
        evaluated by Prometheus; against the client's median or nearest-rank quantile. Each row's
        note gives the client's values put through the same buckets (bucket error vs measurement
        error) and the client's neighbouring values (how finely the sample fixes the quantile);
      - vLLM: the same means and quantiles from vLLM's own histograms (vllm:time_to_first_token_seconds,
        vllm:inter_token_latency_seconds, vllm:e2e_request_latency_seconds), shown, not checked;
      - per request: the gateway's access log has each request's ttft and duration; matched by
        x-request-id, (client - gateway) is the loopback + HTTP client time, reported as is.
  (b) Tokens: Δ gateway_output_tokens_total (Prometheus) vs the client's summed usage vs vLLM's own
      Δ vllm:generation_tokens_total (read from vLLM's /metrics); the same for prompt tokens.
  (c) Aggregate tok/s: sum(rate(gateway_output_tokens_total[W])) evaluated at the client's end time
      with W = the client's wall time, vs the client's completion tokens / wall time; the raw
      samples in the window say where the two part.

Targets: every mean and quantile within 2 %, tokens equal, rate within 5 %. It prints one Markdown table per
concurrency and, with --json, writes every figure; the exit status is 1 when a target is missed.

    python benchmarks/metric_truth.py                     # 1, 4, 16, 32 clients, 20 s each
    python benchmarks/metric_truth.py --concurrency 1,4 --duration 10 --json /tmp/truth.json

Needs the real vLLM (bash tests/engines/setup.sh vllm; GATEWAY_CI_CACHE selects the cache) and the
`prometheus` binary (apt-get install prometheus). vLLM starts in 20-60 s; then each level takes its
duration plus the time its last requests need to finish plus ~5 s (about 2 minutes in all on 2 CPUs).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import itertools
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import httpx

from engines.promtext import read_labelled

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.gateway_process import GatewayProcess  # noqa: E402
from gateway.metrics import (  # noqa: E402  (bucket bounds, for the client's side)
    _DURATION_BUCKETS,
    _ITL_BUCKETS,
    _TPS_BUCKETS,
    _TTFT_BUCKETS,
)


def _load(name: str, path: Path) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# The integration tier's engine launcher and the Prometheus tier's server helper, by path (the same
# module names their conftests use, so that a test importing this file shares them).
servers = _load("gateway_test_engine_servers", REPO / "tests" / "engines" / "servers.py")
prometheus_server = _load("prometheus_server", REPO / "tests" / "prometheus" / "prometheus_server.py")
isolate_engine = _load("gateway_bench_cpus", REPO / "benchmarks" / "cpus.py").isolate_engine

TARGET_LATENCY = 0.02
TARGET_TOKENS = 0.02
TARGET_RATE = 0.05


# ---- reading /metrics ---------------------------------------------------------------------------


def scrape(url: str) -> dict[str, float]:
    """`name{labels}` -> value for every sample of a /metrics page; plus `name` -> sum over labels."""
    text = httpx.get(url, timeout=10).text
    out: dict[str, float] = {}
    for (name, labels), value in read_labelled(text).items():
        out[name] = out.get(name, 0.0) + value
        le = dict(labels).get("le")
        if le is not None:
            key = f"{name}{{le={le}}}"
            out[key] = out.get(key, 0.0) + value
    return out


def gateway_totals(metrics_url: str) -> dict[str, float]:
    m = scrape(metrics_url)
    names = (
        "gateway_time_to_first_token_seconds_sum",
        "gateway_time_to_first_token_seconds_count",
        "gateway_request_duration_seconds_sum",
        "gateway_request_duration_seconds_count",
        "gateway_inter_token_latency_seconds_sum",
        "gateway_inter_token_latency_seconds_count",
        "gateway_request_output_tokens_per_second_sum",
        "gateway_request_output_tokens_per_second_count",
        "gateway_output_tokens_total",
        "gateway_prompt_tokens_total",
        "gateway_requests_total",
    )
    return {n: m.get(n, 0.0) for n in names}


def vllm_totals(metrics_url: str) -> dict[str, float]:
    m = scrape(metrics_url)
    return {
        n: m.get(n, 0.0)
        for n in (
            "vllm:generation_tokens_total",
            "vllm:prompt_tokens_total",
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
        )
    }


def wait_engine_idle(metrics_url: str, timeout: float = 60.0) -> None:
    """Until vLLM runs and queues nothing (work a previous client abandoned would still count)."""
    deadline = time.monotonic() + timeout
    while True:
        m = vllm_totals(metrics_url)
        if m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"vLLM still busy after {timeout} s: {m}")
        time.sleep(0.2)


# ---- the gateway, as its own process ------------------------------------------------------------


def access_log(log: str) -> dict[str, tuple[float, float | None, int]]:
    """request id -> (duration, ttft or None, out_tokens), from the gateway's access log."""
    pattern = re.compile(r"gateway\.access (\S+) \S+ .* duration=([\d.]+) ttft=(\S+) out_tokens=(\d+)")
    out = {}
    for line in log.splitlines():
        m = pattern.search(line)
        if m:
            ttft = None if m.group(3) == "-" else float(m.group(3))
            out[m.group(1)] = (float(m.group(2)), ttft, int(m.group(4)))
    return out


def start_gateway(vllm_url: str, workdir: Path, max_in_flight: int | None = None) -> GatewayProcess:
    backend: dict[str, Any] = {"url": vllm_url, "name": "vllm-0", "model": servers.MODEL_NAME}
    if max_in_flight is not None:
        backend["max_in_flight"] = max_in_flight
    config = {
        # vLLM's API server shares its core with the decoding worker here: give /health time, or a
        # busy engine is marked down and the level measures 503s.
        "health": {"interval_s": 2, "timeout_s": 10, "scrape_interval_s": 1},
        "pools": {"vllm": {"engine": "vllm", "backends": [backend]}},
        "routes": [{"model": "tiny", "pools": ["vllm"]}],
    }
    return GatewayProcess(config, log_level="info", workdir=workdir).start(ready="/readyz")


# ---- the client ---------------------------------------------------------------------------------


@dataclass
class ClientRequest:
    request_id: str
    status: int
    ttft: float | None  # just before sending -> first chunk with non-empty content
    e2e: float  # just before sending -> end of the stream
    completion_tokens: int
    prompt_tokens: int
    ended_at: float  # unix time the stream ended
    gaps: list[float] = field(default_factory=list)  # between consecutive chunks with content (ITL)
    tps: float | None = None  # (completion tokens - 1) / (last content chunk - first), as the gateway


@dataclass
class ClientRun:
    concurrency: int
    requests: list[ClientRequest]
    t_start: float  # unix time, just before the first request
    t_end: float  # unix time, after the last stream ended
    loop_lag_ms: dict[str, float]  # how late a 5 ms sleep in the client's event loop woke: p50, p99, max

    @property
    def wall(self) -> float:
        return self.t_end - self.t_start


def _content(event: dict[str, Any]) -> bool:
    return any((choice.get("delta") or {}).get("content") for choice in event.get("choices") or ())


def prompt_text(request_id: str, words: int) -> str:
    """A prompt of about `words` + 8 words that differs from its first word on (no prefix-cache hits)."""
    filler = " ".join(f"w{(zlib.crc32(request_id.encode()) + i * 7919) % 997}" for i in range(words))
    return f"Request {request_id}: {filler}. Tell me a story about it."


async def _one(
    session: aiohttp.ClientSession, url: str, request_id: str, max_tokens: int, prompt_words: int
) -> ClientRequest:
    body = json.dumps(
        {
            "model": servers.MODEL_NAME,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": prompt_text(request_id, prompt_words)}],
        }
    ).encode()
    headers = {"content-type": "application/json", "x-request-id": request_id}
    ttft = None
    usage: dict[str, Any] = {}
    buf = b""
    content_at: list[float] = []
    t0 = time.perf_counter()
    async with session.post(url, data=body, headers=headers) as response:
        async for chunk in response.content.iter_any():
            now = time.perf_counter()
            buf += chunk
            while b"\n\n" in buf:
                raw, buf = buf.split(b"\n\n", 1)
                if not raw.startswith(b"data: {"):
                    continue
                event = json.loads(raw[6:])
                if _content(event):
                    content_at.append(now)
                    if ttft is None:
                        ttft = now - t0
                if event.get("usage"):
                    usage = event["usage"]
        status = response.status
    e2e = time.perf_counter() - t0
    completion = int(usage.get("completion_tokens") or 0)
    decode = content_at[-1] - content_at[0] if content_at else 0.0
    return ClientRequest(
        request_id,
        status,
        ttft,
        e2e,
        completion,
        int(usage.get("prompt_tokens") or 0),
        time.time(),
        [b - a for a, b in itertools.pairwise(content_at)],
        (completion - 1) / decode if completion > 1 and decode > 0 else None,
    )


async def run_clients(
    base_url: str,
    concurrency: int,
    duration: float,
    max_requests: int,
    max_tokens: int,
    prompt_words: int = 0,
    tag: str = "mt",
) -> ClientRun:
    """`concurrency` clients, each sending one request after another until `duration` seconds have
    passed or it sent `max_requests`; each request already sent is finished.

    The client is aiohttp, one keep-alive connection per client. (httpx's AsyncClient was tried
    first: at 16 concurrent streams against a simulated engine it held requests for up to 217 ms,
    p95 40 ms, before sending their first byte, which the client would have counted as TTFT;
    aiohttp, in the same setup, at most 5 ms, p95 0.6 ms.)"""
    url = f"{base_url}/v1/chat/completions"
    done: list[ClientRequest] = []
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def healthz() -> None:  # open every connection first: no request pays for a handshake
            async with session.get(f"{base_url}/healthz") as response:
                await response.read()

        await asyncio.gather(*(healthz() for _ in range(concurrency)))
        lags: list[float] = []
        running = True

        async def probe() -> None:
            while running:
                t = time.perf_counter()
                await asyncio.sleep(0.005)
                lags.append((time.perf_counter() - t - 0.005) * 1000)

        prober = asyncio.create_task(probe())
        t_start = time.time()
        deadline = time.monotonic() + duration

        async def loop(index: int) -> None:
            for n in range(max_requests):
                if n > 0 and time.monotonic() >= deadline:
                    return
                rid = f"{tag}-c{concurrency}-{index}-{n}"
                done.append(await _one(session, url, rid, max_tokens, prompt_words))

        await asyncio.gather(*(loop(i) for i in range(concurrency)))
        t_end = time.time()
        running = False
        await prober
    lags.sort()
    lag = {"p50": lags[len(lags) // 2], "p99": lags[int(0.99 * (len(lags) - 1))], "max": lags[-1]} if lags else {}
    return ClientRun(concurrency, done, t_start, t_end, lag)


# ---- Prometheus ---------------------------------------------------------------------------------


def prom_value(prom: Any, expr: str, at: float) -> float:
    data = prom.api("query", query=expr, time=f"{at:.3f}")
    result = data["result"]
    if data["resultType"] == "scalar":
        return float(result[1])
    if not result:
        return math.nan
    assert len(result) == 1, (expr, result)
    return float(result[0]["value"][1])


def histogram_quantile(q: float, bounds: Sequence[float], values: Sequence[float]) -> float:
    """Prometheus' histogram_quantile over the client's own values put into the gateway's buckets."""
    counts = [sum(1 for v in values if v <= b) for b in bounds] + [len(values)]
    total = counts[-1]
    if total == 0:
        return math.nan
    rank = q * total
    for i, c in enumerate(counts):
        if c >= rank:
            if i == len(bounds):
                return bounds[-1]
            lower = bounds[i - 1] if i > 0 else 0.0
            below = counts[i - 1] if i > 0 else 0
            return lower + (bounds[i] - lower) * (rank - below) / (c - below)
    return bounds[-1]


def sample_quantile(q: float, values: Sequence[float]) -> float:
    """The client's exact q-quantile: the median, or else the nearest-rank value (the ceil(q*n)-th
    smallest). histogram_quantile estimates the value at rank q*n, which is that one as buckets
    narrow; an interpolating definition (numpy's default, rank q*(n-1)+1) differs from it by a
    whole gap between two of the sample's values where the tail is sparse."""
    xs = sorted(values)
    if q == 0.5:
        return statistics.median(xs)
    return xs[max(0, math.ceil(q * len(xs)) - 1)]


def _resolution(q: float, values: Sequence[float], unit: str) -> str:
    """How finely the client's own sample fixes its q-quantile: the values either side of rank q*n."""
    xs = sorted(values)
    k = max(0, math.ceil(q * len(xs)) - 1)
    lo, hi = xs[max(0, k - 1)], xs[min(len(xs) - 1, k + 1)]
    return (
        f"Of the client's {len(xs)} values, the ones either side of p{q * 100:.0f} are {_num(lo, unit)} and "
        f"{_num(hi, unit)} ({_pct((hi - lo) / lo) if lo else 'n/a'} apart)"
    )


def scraped_quantile(q: float, family: str, before: dict[str, float], after: dict[str, float]) -> float:
    """histogram_quantile over the increase of a scraped histogram (all its series summed): what
    Prometheus would compute from vLLM's own buckets over the level."""
    prefix = f"{family}_bucket{{le="
    keys = sorted((float(k[len(prefix) : -1]), k) for k in after if k.startswith(prefix))
    if not keys:
        return math.nan
    les = [b for b, _ in keys]
    cum = [after[k] - before.get(k, 0.0) for _, k in keys]
    total = cum[-1]
    rank = q * total
    for i, c in enumerate(cum):
        if c >= rank and total > 0:
            if math.isinf(les[i]):
                return les[i - 1]
            lower, below = (les[i - 1], cum[i - 1]) if i > 0 else (0.0, 0.0)
            return lower + (les[i] - lower) * (rank - below) / (c - below) if c > below else les[i]
    return math.nan


DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "gateway.json"

# what -> (the gateway's histogram, its bucket bounds, the quantiles compared). tok/s also shows
# p10, the slow tail the dashboard draws for it.
FAMILIES: dict[str, tuple[str, Sequence[float], tuple[float, ...]]] = {
    "TTFT": ("gateway_time_to_first_token_seconds", _TTFT_BUCKETS, (0.5, 0.95)),
    "ITL": ("gateway_inter_token_latency_seconds", _ITL_BUCKETS, (0.5, 0.95)),
    "e2e": ("gateway_request_duration_seconds", _DURATION_BUCKETS, (0.5, 0.95)),
    "per-request tok/s": ("gateway_request_output_tokens_per_second", _TPS_BUCKETS, (0.1, 0.5, 0.95)),
}
# The engine's own histograms of the same quantities (vLLM v1 names).
VLLM_FAMILIES = {
    "TTFT": "vllm:time_to_first_token_seconds",
    "ITL": "vllm:inter_token_latency_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
}


def dashboard_quantile(family: str, q: float, window: str) -> str:
    """The Grafana dashboard's own quantile query for `family`, as Grafana sends it with every route
    selected and `$__rate_interval` = `window`, at quantile `q`."""
    for e in prometheus_server.sources.dashboard_exprs(DASHBOARD):
        if e.expr.startswith("histogram_quantile(") and f"({family}_bucket" in e.expr:
            expr = prometheus_server.substitute(e.expr, window)
            return re.sub(r"histogram_quantile\(\s*[0-9.]+\s*,", f"histogram_quantile({q},", expr)  # both halves
    raise LookupError(f"no dashboard quantile panel for {family}")


# ---- one level ----------------------------------------------------------------------------------


@dataclass
class Row:
    quantity: str
    client: float
    gateway: float
    vllm: float | None
    target: float | None  # relative, gateway vs client (and vs vLLM for tokens)
    note: str = ""
    vllm_target: bool = True  # False: the vLLM figure is shown for comparison, not checked

    @property
    def diff(self) -> float:
        return (self.gateway - self.client) / self.client if self.client else math.nan

    @property
    def ok(self) -> bool | None:
        if self.target is None:
            return None
        ok = abs(self.diff) <= self.target
        if self.vllm is not None and self.vllm_target and not math.isnan(self.vllm):
            ok = ok and abs(self.gateway - self.vllm) <= self.target * self.vllm
        return ok


@dataclass
class LevelResult:
    concurrency: int
    requests: int
    errors: int
    wall_s: float
    rows: list[Row]
    overhead_ms: dict[str, float] = field(default_factory=dict)  # per-request client - gateway
    checks: dict[str, bool] = field(default_factory=dict)
    client_loop_lag_ms: dict[str, float] = field(default_factory=dict)
    source: str = "Prometheus"  # where the gateway's figures were read: "Prometheus" or "/metrics"


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x * 100:+.2f} %"


def _num(x: float | None, unit: str) -> str:
    if x is None:
        return "—"
    if math.isnan(x):
        return "NaN"
    if unit == "s":
        return f"{x * 1000:.2f} ms"
    if unit == "tok/s":
        return f"{x:.1f}"
    return f"{x:.0f}"


UNITS = {"TTFT": "s", "e2e": "s", "ITL": "s", "tokens": "", "tok/s": "tok/s"}


def _unit(quantity: str) -> str:
    return next((u for k, u in UNITS.items() if k in quantity), "")


def markdown(level: LevelResult) -> str:
    lines = [
        f"### {level.concurrency} concurrent client{'s' if level.concurrency > 1 else ''}: "
        f"{level.requests} requests in {level.wall_s:.1f} s",
        "",
        f"| quantity | client | gateway ({level.source}) | vLLM | gateway vs client | target | ok |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in level.rows:
        unit = _unit(r.quantity)
        ok = "—" if r.ok is None else ("yes" if r.ok else "**no**")
        target = "—" if r.target is None else f"±{r.target * 100:.0f} %"
        lines.append(
            f"| {r.quantity} | {_num(r.client, unit)} | {_num(r.gateway, unit)} | {_num(r.vllm, unit)} "
            f"| {_pct(r.diff)} | {target} | {ok} |"
        )
    notes = [r for r in level.rows if r.note]
    if level.overhead_ms:
        o = level.overhead_ms
        lines += [
            "",
            f"Per request, client - gateway ({o['matched']:.0f} requests matched by x-request-id in the "
            f"access log): TTFT mean {o['ttft_mean']:.2f} ms, median {o['ttft_median']:.2f} ms, p95 "
            f"{o['ttft_p95']:.2f} ms; e2e mean {o['e2e_mean']:.2f} ms, median {o['e2e_median']:.2f} ms, "
            f"p95 {o['e2e_p95']:.2f} ms. This is the loopback and the HTTP client on both ends of the "
            "request, which the gateway's clock (arrival to first chunk received, arrival to last byte "
            "written) does not see.",
        ]
    if level.client_loop_lag_ms:
        lag = level.client_loop_lag_ms
        lines.append(
            f"Client event-loop lag (a 5 ms sleep woke late by): p50 {lag['p50']:.2f} ms, "
            f"p99 {lag['p99']:.2f} ms, max {lag['max']:.2f} ms."
        )
    for r in notes:
        lines.append(f"- {r.quantity}: {r.note}")
    if level.checks:
        lines.append("- " + "; ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in level.checks.items()))
    return "\n".join(lines)


def run_level(
    gw: GatewayProcess,
    vllm: Any,
    prom: Any | None,
    concurrency: int,
    duration: float,
    max_requests: int,
    max_tokens: int,
    prompt_words: int = 0,
    settle_s: float = 2.5,
) -> LevelResult:
    """One concurrency level, with before/after snapshots of the gateway, vLLM and Prometheus."""
    wait_engine_idle(vllm.metrics_url)
    time.sleep(settle_s)  # Prometheus scrapes the idle state at least twice
    t_before = time.time()
    gw0, vl0, vh0 = gateway_totals(f"{gw.base_url}/metrics"), vllm_totals(vllm.metrics_url), scrape(vllm.metrics_url)
    gh0 = scrape(f"{gw.base_url}/metrics")  # every bucket: the exact Δ quantile, beside rate()'s
    run = asyncio.run(run_clients(gw.base_url, concurrency, duration, max_requests, max_tokens, prompt_words))
    wait_engine_idle(vllm.metrics_url)
    time.sleep(settle_s)  # and the state after the last request
    t_after = time.time()
    gw1, vl1, vh1 = gateway_totals(f"{gw.base_url}/metrics"), vllm_totals(vllm.metrics_url), scrape(vllm.metrics_url)
    gh1 = scrape(f"{gw.base_url}/metrics")

    ok = [r for r in run.requests if r.status == 200 and r.ttft is not None]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    e2es = [r.e2e for r in ok]
    gaps = [g for r in ok for g in r.gaps]
    tpss = [r.tps for r in ok if r.tps is not None]
    client_values = {"TTFT": ttfts, "ITL": gaps, "e2e": e2es, "per-request tok/s": tpss}
    c_out = sum(r.completion_tokens for r in run.requests)
    client_rate = c_out / run.wall
    c_prompt = sum(r.prompt_tokens for r in run.requests)

    def delta(name: str) -> float:
        return gw1[name] - gw0[name]

    rows: list[Row] = []
    checks: dict[str, bool] = {}
    if prom is not None:

        def pdelta(expr: str) -> float:
            return prom_value(prom, expr, t_after) - prom_value(prom, expr, t_before)

        window = f"{math.ceil((t_after - t_before) * 1000)}ms"

        ttft_sum = pdelta("sum(gateway_time_to_first_token_seconds_sum)")
        ttft_count = pdelta("sum(gateway_time_to_first_token_seconds_count)")
        e2e_sum = pdelta("sum(gateway_request_duration_seconds_sum)")
        e2e_count = pdelta("sum(gateway_request_duration_seconds_count)")
        out = pdelta("sum(gateway_output_tokens_total)")
        prompt = pdelta("sum(gateway_prompt_tokens_total)")
        # rate() at the first scrape after the client's end, over the span since the client's start:
        # the counter moves when an answer ends, so at the client's own end time rate() misses the
        # answers that ended together after the last scrape (with 2 s answers at 4 clients, a fifth
        # of a 10 s level's tokens), which says when Prometheus heard, not what the gateway counted.
        t_rate = first_sample_after(prom, "gateway_output_tokens_total", run.t_end, t_after)
        span = t_rate - run.t_start
        rate = prom_value(prom, f"sum(rate(gateway_output_tokens_total[{math.ceil(span * 1000)}ms]))", t_rate)
        client_rate = c_out / span
        rate_note = (
            f"gateway: sum(rate(gateway_output_tokens_total[{span:.1f}s])) at the first scrape after the client's "
            f"end; client: its completion tokens over the same span. {_rate_diagnosis(prom, run, t_rate, span)}"
        )
        quantiles = {
            (what, q): prom_value(prom, dashboard_quantile(family, q, window), t_after)
            for what, (family, _bounds, qs) in FAMILIES.items()
            for q in qs
        }
        means = {
            what: pdelta(f"sum({family}_sum)") / pdelta(f"sum({family}_count)")
            for what, (family, _bounds, _qs) in FAMILIES.items()
        }
        checks["Prometheus Δ = the gateway's own /metrics Δ"] = (
            math.isclose(ttft_sum, delta("gateway_time_to_first_token_seconds_sum"), rel_tol=1e-9)
            and math.isclose(e2e_sum, delta("gateway_request_duration_seconds_sum"), rel_tol=1e-9)
            and out == delta("gateway_output_tokens_total")
            and prompt == delta("gateway_prompt_tokens_total")
        )
    else:  # the gateway's own /metrics, no Prometheus: means and tokens only, rate as Δcounter / wall
        ttft_sum, ttft_count = (
            delta("gateway_time_to_first_token_seconds_sum"),
            delta("gateway_time_to_first_token_seconds_count"),
        )
        e2e_sum, e2e_count = (
            delta("gateway_request_duration_seconds_sum"),
            delta("gateway_request_duration_seconds_count"),
        )
        out, prompt = delta("gateway_output_tokens_total"), delta("gateway_prompt_tokens_total")
        rate = out / run.wall
        quantiles = {}
        means = {
            what: delta(f"{family}_sum") / delta(f"{family}_count") for what, (family, _bounds, _qs) in FAMILIES.items()
        }
        rate_note = "gateway: Δgateway_output_tokens_total / the client's wall time"
    checks[f"every request counted once ({len(run.requests)})"] = (
        ttft_count == len(ttfts)
        and e2e_count == len(run.requests)
        and delta("gateway_requests_total") == len(run.requests)
    )

    def vdelta(name: str) -> float:
        return vl1[name] - vl0[name]

    for what, (family, bounds, qs) in FAMILIES.items():
        values = client_values[what]
        engine = VLLM_FAMILIES.get(what)
        engine_mean = engine_quantiles = None
        if engine is not None and vh1.get(f"{engine}_count", 0.0) > vh0.get(f"{engine}_count", 0.0):
            engine_mean = (vh1[f"{engine}_sum"] - vh0[f"{engine}_sum"]) / (
                vh1[f"{engine}_count"] - vh0[f"{engine}_count"]
            )
            engine_quantiles = {q: scraped_quantile(q, engine, vh0, vh1) for q in qs}
        label = "TTFT mean (Δsum/Δcount)" if what == "TTFT" else f"{what} mean (Δsum/Δcount)"
        if not values:
            continue
        rows.append(Row(label, statistics.fmean(values), means[what], engine_mean, TARGET_LATENCY, vllm_target=False))
        for q in qs:
            gateway_q = quantiles.get((what, q), math.nan)
            if math.isnan(gateway_q):
                continue
            client_q = sample_quantile(q, values)
            through = histogram_quantile(q, bounds, values)
            rows.append(
                Row(
                    f"{what} p{q * 100:.0f} (dashboard's histogram_quantile)",
                    client_q,
                    gateway_q,
                    engine_quantiles[q] if engine_quantiles else None,
                    TARGET_LATENCY,
                    note=f"the client's own values through the gateway's buckets give {_num(through, _unit(what))} "
                    f"({_pct((gateway_q - through) / through)} from the gateway's): the rest is measurement. "
                    f"The gateway's own buckets, their exact Δ between the level's two instants (no rate() "
                    f"extrapolation), give {_num(scraped_quantile(q, family, gh0, gh1), _unit(what))}. "
                    + _resolution(q, values, _unit(what)),
                    vllm_target=False,
                )
            )

    rows.append(Row("output tokens", c_out, out, vdelta("vllm:generation_tokens_total"), TARGET_TOKENS))
    rows.append(Row("prompt tokens", c_prompt, prompt, vdelta("vllm:prompt_tokens_total"), TARGET_TOKENS))
    rows.append(Row("aggregate output tok/s", client_rate, rate, None, TARGET_RATE, note=rate_note))
    checks["every request answered 200 with content"] = all(
        r.status == 200 and r.ttft is not None for r in run.requests
    )

    overhead: dict[str, float] = {}
    log = access_log(gw.log())
    pairs = [(r, log[r.request_id]) for r in ok if r.request_id in log]
    if pairs:
        d_ttft = sorted((r.ttft - g[1]) * 1000 for r, g in pairs if r.ttft is not None and g[1] is not None)
        d_e2e = sorted((r.e2e - g[0]) * 1000 for r, g in pairs)
        overhead = {
            "ttft_mean": statistics.fmean(d_ttft),
            "ttft_median": statistics.median(d_ttft),
            "ttft_p95": d_ttft[int(0.95 * (len(d_ttft) - 1))],
            "e2e_mean": statistics.fmean(d_e2e),
            "e2e_median": statistics.median(d_e2e),
            "e2e_p95": d_e2e[int(0.95 * (len(d_e2e) - 1))],
            "matched": float(len(pairs)),
        }
    errors = sum(1 for r in run.requests if r.status != 200 or r.ttft is None)
    return LevelResult(
        concurrency,
        len(run.requests),
        errors,
        run.wall,
        rows,
        overhead,
        checks,
        run.loop_lag_ms,
        "Prometheus" if prom is not None else "/metrics",
    )


def first_sample_after(prom: Any, metric: str, after: float, now: float) -> float:
    """The time of the first sample of `metric` Prometheus stored after `after` (`now` at the latest)."""
    data = prom.api("query", query=f"{metric}[{math.ceil((now - after) * 1000)}ms]", time=f"{now:.3f}")
    times = [float(ts) for series in data["result"] for ts, _ in series["values"] if float(ts) > after]
    return min(times, default=now)


def _rate_diagnosis(prom: Any, run: ClientRun, at: float, span: float) -> str:
    """What rate() saw: the raw samples in the window, and the client's own rate over the same span."""
    window = f"{math.ceil(span * 1000)}ms"
    data = prom.api("query", query=f"gateway_output_tokens_total[{window}]", time=f"{at:.3f}")
    points: dict[float, float] = {}
    for series in data["result"]:
        for ts, value in series["values"]:
            points[float(ts)] = points.get(float(ts), 0.0) + float(value)
    if len(points) < 2:
        return f"only {len(points)} sample(s) in the window"
    times = sorted(points)
    first, last = times[0], times[-1]
    sampled = (points[last] - points[first]) / (last - first)
    client = sum(r.completion_tokens for r in run.requests if first < r.ended_at <= last) / (last - first)
    before = [r for r in run.requests if r.ended_at <= first]
    after = [r for r in run.requests if r.ended_at > last]
    total = sum(r.completion_tokens for r in run.requests) or 1
    return (
        f"rate() had {len(times)} samples, the first {first - run.t_start:.2f} s after the start and the last "
        f"{last - run.t_end:.2f} s after the end. Between them the counter rose at {sampled:.1f} tok/s and the "
        f"client's completed tokens at {client:.1f} tok/s ({_pct((sampled - client) / client) if client else 'n/a'}"
        f"); rate() extrapolates that to the window. Outside them: {len(before)} requests "
        f"({sum(r.completion_tokens for r in before) / total:.1%} of the tokens) ended before the first sample "
        f"and {len(after)} ({sum(r.completion_tokens for r in after) / total:.1%}) after the last. The counter "
        "moves when a request ends, by its whole usage, so answers that end together just after the last "
        "scrape are what rate() misses and tokens / wall time counts"
    )


# ---- the whole benchmark ------------------------------------------------------------------------


@contextmanager
def stack(
    workdir: Path,
    max_num_seqs: int,
    max_model_len: int = 1024,
    with_prometheus: bool = True,
    isolate: bool = True,
    launch: Callable[..., Any] | None = None,
) -> Iterator[tuple[Any, Any, Any]]:
    """(vllm, gateway, prometheus or None), all stopped on exit (vLLM by `launch`'s owner when one
    is given: the tests pass their engine_launcher). With `isolate`, vLLM gets CPU 0 to itself and
    the rest run on the other CPUs (see isolate_engine) until the end."""
    kwargs = {
        "max_model_len": max_model_len,
        "max_num_seqs": max_num_seqs,
        "log_path": workdir / "vllm.log",
        "cpu_omp_threads_bind": "0" if isolate and len(os.sched_getaffinity(0)) > 1 else None,
    }
    vllm = (launch or servers.start_vllm)(**kwargs)
    gw = prom = None
    cpus = os.sched_getaffinity(0)
    try:
        if isolate:
            isolate_engine(vllm.pid)
        gw = start_gateway(vllm.base_url, workdir)
        if with_prometheus:
            prom = prometheus_server.start_prometheus(workdir / "prometheus", gw.base_url.removeprefix("http://"))
            prom.wait_for_targets_up()
        yield vllm, gw, prom
    finally:
        if prom is not None:
            prom.stop()
        if gw is not None:
            gw.stop()
        if launch is None:
            vllm.stop()
        os.sched_setaffinity(0, cpus)


def warm_up(gw: GatewayProcess, max_tokens: int) -> None:
    """A few requests first: vLLM's first batches are slow, and every histogram series exists."""
    asyncio.run(run_clients(gw.base_url, 2, 0.0, 2, max_tokens, tag="warmup"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", default="1,4,16,32", help="comma-separated levels (default 1,4,16,32)")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of load per level (default 20)")
    parser.add_argument("--max-requests", type=int, default=500, help="most requests per client and level")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument(
        "--prompt-words",
        type=int,
        default=700,
        help="filler words per prompt (default 700: about 2,700 prompt tokens with the tiny model)",
    )
    parser.add_argument("--max-num-seqs", type=int, default=16, help="vLLM's batch size (default 16)")
    parser.add_argument("--max-model-len", type=int, default=4096, help="vLLM's context (default 4096)")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--workdir", type=Path, help="logs and Prometheus data (default: a temp dir)")
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    missing = servers.engine_missing("vllm")
    if missing:
        print(missing, file=sys.stderr)
        return 2
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="metric-truth-"))
    print(f"# Metric truth: gateway vs client vs vLLM\n\nlogs in {workdir}", flush=True)
    results = []
    t0 = time.monotonic()
    with stack(workdir, args.max_num_seqs, args.max_model_len) as (vllm, gw, prom):
        print(
            f"vLLM ready in {vllm.ready_seconds:.0f} s (max_num_seqs {args.max_num_seqs}); gateway {gw.base_url}; "
            f"Prometheus {prom.url} scraping every 1 s\n",
            flush=True,
        )
        warm_up(gw, args.max_tokens)
        for c in levels:
            level = run_level(gw, vllm, prom, c, args.duration, args.max_requests, args.max_tokens, args.prompt_words)
            results.append(level)
            print(markdown(level) + "\n", flush=True)
    print(f"total {time.monotonic() - t0:.0f} s")
    failed = [(lv.concurrency, r.quantity) for lv in results for r in lv.rows if r.ok is False]
    failed += [(lv.concurrency, k) for lv in results for k, v in lv.checks.items() if not v]
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {**asdict(lv), "rows": [{**asdict(r), "diff": r.diff, "ok": r.ok} for r in lv.rows]}
                    for lv in results
                ],
                indent=1,
            )
        )
    if failed:
        print("targets missed: " + ", ".join(f"{q} at {c}" for c, q in failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
