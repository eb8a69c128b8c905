"""Every PromQL expression of the dashboard and of the recording and alert rules returns data, on a
real Prometheus that scraped a gateway under a mixed load.

The stack: the gateway in-process (a real uvicorn on a loopback socket) in front of simulated engines
in four pools, and Prometheus (Debian's binary) scraping it every second with the deploy rules
loaded. The load varies its concurrency from 1 to 16 and mixes every path that feeds a metric:
streams and plain answers, prompts over a context cap (rejected), a truncate_oldest route, clamped
and defaulted max_tokens, a backend that always answers 500 (retries, upstream errors, passive
ejection), a tiny retry budget (exhausted), `x-sim-fault` die_after (midstream errors), stall
(idle timeouts) and headers_delay (first-byte timeouts), clients that hang up mid-stream, unknown
models, shared-prefix traffic that a rule sends to another pool, a max_in_flight=1 backend (queue
wait), a client key with a token budget and engine-load scraping every second.

Then every expression is evaluated as one instant query at the end through the HTTP API. The
windows are the deployed ones, `[1m]` (and `$__rate_interval` = 1m): the whole load fits in one
minute, so rewriting them shorter is not needed and the deployed text is what is tested. "Returns
data" means a non-empty result with at least one sample that is not NaN: a histogram_quantile over
a window without observations returns NaN samples, which a panel shows as "No data". Alert rules
are conditions that are empty while all is well, so for them the test evaluates the expression
with its comparisons against a number removed (`x > 0.05 and on (route) y > 0.1` becomes
`x and on (route) y`) and asserts that this returns data. All failures are listed at once.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.prometheus.prometheus_server import PrometheusServer, sources, start_prometheus

pytestmark = [pytest.mark.prometheus, pytest.mark.live]

# Concurrency phases, (active clients, seconds): 1..16 up and down. About 24 s of load in all.
PHASES = [(1, 2.0), (4, 2.5), (16, 3.0), (8, 2.5), (2, 2.0), (12, 3.0), (6, 2.5), (16, 2.5), (3, 2.0), (1, 2.0)]
MAX_CLIENTS = max(c for c, _ in PHASES)
CLIENT_KEY = "sk-test-team-a"
SHARED_SYSTEM = "You are an agent working on the repository. " * 12  # ~550 chars, the same every time


# ---- the stack ----------------------------------------------------------------------------------


@dataclass
class Stack:
    base_url: str
    gateway: Any
    prometheus: PrometheusServer


def _gateway_config(urls: dict[str, str]) -> dict[str, Any]:
    def backend(name: str, **extra: Any) -> dict[str, Any]:
        return {"url": urls[name], "name": name, "model": "tiny", **extra}

    return {
        "routing": {
            "platform": "nvidia_gpu",
            "shared_prefix": {"min_seen": 2, "min_prefix_chars": 256, "block_chars": 64},
        },
        # A short queue: the max_in_flight=1 pool's backlog overflows it, so requests are shed too.
        "limits": {"queue_timeout_s": 10, "max_queue": 2},
        "timeouts": {"first_byte_s": 0.4, "idle_s": 0.4, "keepalive_s": 0.2},
        "retry": {"max_attempts": 2, "budget_ratio": 0.0, "budget_min": 1},
        # One client key with a daily token budget far above the load: its usage is what the
        # budget panel shows. Every request of the load sends it.
        "keys": [
            {
                "name": "team-a",
                "key": CLIENT_KEY,
                "budgets": [{"period": "day", "input_tokens": 10**9, "output_tokens": 10**9}],
            }
        ],
        "health": {"interval_s": 1, "timeout_s": 1, "scrape_interval_s": 1, "unhealthy_after": 5},
        "pools": {
            "vllm": {
                "engine": "sim",
                "flavour": "vllm",
                "balancer": "least_load",
                "backends": [backend("vllm-0"), backend("vllm-1")],
            },
            "sglang": {
                "engine": "sim",
                "flavour": "sglang",
                "balancer": "prefix_affinity",
                "backends": [backend("sglang-0"), backend("sglang-1")],
            },
            "flaky": {
                "engine": "sim",
                "flavour": "vllm",
                "balancer": "round_robin",
                "backends": [backend("flaky-0"), backend("flaky-1")],
            },
            "queued": {"engine": "sim", "flavour": "vllm", "backends": [backend("queued-0", max_in_flight=1)]},
        },
        "routes": [
            {
                "model": "chat",
                "pools": ["vllm", "sglang"],
                "rules": [
                    {"name": "agent", "when": {"shared_prefix": True}, "pool": "sglang"},
                    {"name": "default", "pool": "vllm"},
                ],
                "caps": {"max_context_tokens": 1024, "default_max_tokens": 12, "max_tokens_limit": 24},
            },
            {
                "model": "trunc",
                "pools": ["vllm"],
                "caps": {"max_context_tokens": 384, "on_exceed": "truncate_oldest", "default_max_tokens": 8},
            },
            {"model": "flaky", "pools": ["flaky"]},
            {"model": "queued", "pools": ["queued"]},
        ],
    }


@asynccontextmanager
async def _stack(tmp: Path) -> AsyncIterator[Stack]:
    from engines.sim.server import SimParams, SimServer
    from gateway.config_loader import parse_config
    from gateway.serving.server import start

    def sim(flavour: str = "vllm", **extra: Any) -> SimServer:
        # 5 ms a token at batch 1: a 12-token answer streams for ~60-100 ms.
        return SimServer(
            SimParams.preset(
                "fast",
                flavour=flavour,
                base_step_s=0.005,
                per_seq_step_s=0.0005,
                **extra,
            )
        )

    sims = {
        "vllm-0": sim(),
        "vllm-1": sim(),
        "sglang-0": sim("sglang"),
        "sglang-1": sim("sglang"),
        "flaky-0": sim(fault="status=500"),
        "flaky-1": sim(),
        "queued-0": sim(),
    }
    started: list[Any] = []
    server = task = prometheus = None
    try:
        for s in sims.values():
            await s.start()
            started.append(s)
        config = parse_config(_gateway_config({n: s.base_url for n, s in sims.items()}), env={})
        running = await start(config, platform="nvidia_gpu")
        server, task, port = running.server, running.task, running.port
        prometheus = await asyncio.to_thread(start_prometheus, tmp / "prometheus", f"127.0.0.1:{port}")
        await asyncio.to_thread(prometheus.wait_for_targets_up)
        yield Stack(running.base_url, running.gateway, prometheus)
    finally:
        if prometheus is not None:
            prometheus.stop()
        if server is not None and task is not None:
            server.should_exit = True
            await task
        for s in started:
            await s.stop()


# ---- the load -----------------------------------------------------------------------------------


def _msg(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


def _request(kind: str, rng: random.Random) -> tuple[dict[str, Any], dict[str, str], int | None]:
    """(body, headers, content events to read before hanging up or None) for one kind of request."""
    stream = rng.random() < 0.7
    q = f"question {rng.randrange(10**6)}"
    body: dict[str, Any] = {"model": "chat", "messages": _msg(q), "max_tokens": 12, "stream": stream}
    headers: dict[str, str] = {}
    hang_up: int | None = None
    if kind == "plain":
        pass
    elif kind == "usage":
        body.update(stream=True, stream_options={"include_usage": True})
    elif kind == "defaulted":
        del body["max_tokens"]
    elif kind == "clamped":
        body["max_tokens"] = 10_000
    elif kind == "over_cap":
        body["messages"] = _msg("word " * 3000)
    elif kind == "truncated":
        history = [{"role": "system", "content": "be brief"}]
        for i in range(8):
            history += [
                {"role": "user", "content": f"q{i} " + "word " * 60},
                {"role": "assistant", "content": "answer " * 60},
            ]
        body.update(model="trunc", messages=[*history, {"role": "user", "content": q}])
    elif kind == "shared_prefix":
        body["messages"] = [{"role": "system", "content": SHARED_SYSTEM}, *_msg(q)]
    elif kind == "unknown_model":
        body["model"] = f"no-such-model-{rng.randrange(1000)}"
    elif kind == "flaky":
        body["model"] = "flaky"
    elif kind == "queued":
        body["model"] = "queued"
        # Slow enough that the max_in_flight=1 backend's backlog passes max_queue and requests are
        # shed whatever the machine's speed (the shed panel needs some).
        headers["x-sim-fault"] = "headers_delay=0.3"
        if rng.random() < 0.5:
            headers["x-gateway-priority"] = "batch"
    elif kind == "status_500":
        headers["x-sim-fault"] = "status=500"
    elif kind == "die":
        body["stream"] = True
        headers["x-sim-fault"] = "die_after=3"
    elif kind == "stall":
        body["stream"] = True
        headers["x-sim-fault"] = "stall_after=2"
    elif kind == "slow_headers":
        headers["x-sim-fault"] = "headers_delay=0.6"
    elif kind == "hang_up":
        body.update(stream=True, max_tokens=24)
        headers["x-sim-fault"] = "chunk_delay=0.02"
        hang_up = 2
    else:
        raise AssertionError(kind)
    return body, headers, hang_up


KINDS = {  # kind: weight
    "plain": 6,
    "usage": 3,
    "defaulted": 2,
    "clamped": 2,
    "over_cap": 2,
    "truncated": 2,
    "shared_prefix": 4,
    "unknown_model": 1,
    "flaky": 3,
    "queued": 2,
    "status_500": 1,
    "die": 1,
    "stall": 1,
    "slow_headers": 1,
    "hang_up": 1,
}


async def _one(client: httpx.AsyncClient, url: str, kind: str, rng: random.Random) -> str:
    body, headers, hang_up = _request(kind, rng)
    async with client.stream("POST", url, json=body, headers=headers) as response:
        if hang_up is None:
            await response.aread()
            return str(response.status_code)
        events = 0
        async for chunk in response.aiter_bytes():
            events += chunk.count(b'"content":"')
            if events >= hang_up:
                return "hung_up"  # leaving the block closes the connection mid-stream
        return f"{response.status_code} (finished before the hang-up)"


async def _load(base_url: str) -> Counter[str]:
    """PHASES of concurrency; each active client sends one request after another."""
    url = f"{base_url}/v1/chat/completions"
    results: Counter[str] = Counter()
    active = 1
    stop = False
    kinds, weights = list(KINDS), list(KINDS.values())

    async def client_loop(index: int, client: httpx.AsyncClient) -> None:
        rng = random.Random(index)
        sent = 0
        while not stop:
            if index >= active:
                await asyncio.sleep(0.05)
                continue
            # Each client's first requests walk through every kind, so that each one starts early
            # and recurs in every later scrape; then they are drawn by weight.
            kind = kinds[(index + sent) % len(kinds)] if sent < len(kinds) else rng.choices(kinds, weights)[0]
            sent += 1
            try:
                status = await _one(client, url, kind, rng)
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            results[f"{kind} {status}"] += 1

    limits = httpx.Limits(max_connections=MAX_CLIENTS * 2, max_keepalive_connections=MAX_CLIENTS)
    auth = {"authorization": f"Bearer {CLIENT_KEY}"}
    async with httpx.AsyncClient(timeout=httpx.Timeout(20.0), limits=limits, headers=auth) as client:
        tasks = [asyncio.create_task(client_loop(i, client)) for i in range(MAX_CLIENTS)]
        try:
            for concurrency, seconds in PHASES:
                active = concurrency
                await asyncio.sleep(seconds)
        finally:
            stop = True
            await asyncio.gather(*tasks)
    return results


# ---- the expressions ----------------------------------------------------------------------------

_SET_OPS = re.compile(r"\b(and|or|unless)\b(\s*(?:on|ignoring)\s*\([^()]*\))?")
_COMPARISON = re.compile(r"\s*(==|!=|>=|<=|>|<)\s*(?:bool\s+)?[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?\s*$", re.I)


def _top_level(expr: str, pos: int) -> bool:
    depth = 0
    for ch in expr[:pos]:
        depth += ch in "([{"
        depth -= ch in ")]}"
    return depth == 0 and expr[:pos].count('"') % 2 == 0


def condition_operand(expr: str) -> str:
    """An alert condition without its comparisons against numbers, at the top level of each operand
    of and/or/unless: the values the alert compares, which are there whether or not it fires."""
    parts: list[str] = []
    last = 0
    for m in _SET_OPS.finditer(expr):
        if _top_level(expr, m.start()):
            parts += [expr[last : m.start()], m.group(0)]
            last = m.end()
    parts.append(expr[last:])
    out = []
    for i, part in enumerate(parts):
        if i % 2 == 0:
            cmp = _COMPARISON.search(part)
            if cmp and _top_level(part, cmp.start(1)):
                part = part[: cmp.start()]
        out.append(part.strip())
    return " ".join(out)


def test_condition_operand() -> None:
    assert condition_operand('up{job="gateway"} == 0') == 'up{job="gateway"}'
    assert condition_operand("a:b > 0.05\nand on (route) sum by (route) (c) > 0.1\n") == (
        "a:b and on (route) sum by (route) (c)"
    )
    assert condition_operand("sum by (route) (rate(x[1m])) > 0") == "sum by (route) (rate(x[1m]))"
    assert condition_operand("histogram_quantile(0.5, x)") == "histogram_quantile(0.5, x)"


def _alert_names() -> set[str]:
    return {r["alert"] for p in sources.rule_files() for r in sources.load_rules(p) if "alert" in r}


def _expressions() -> list[tuple[str, str]]:
    """(where, PromQL to evaluate) for every dashboard target, rule and alert."""
    alerts = _alert_names()
    out = []
    for e in sources.deploy_expressions(substitute=True, rate_interval="1m"):
        name = e.where.split(": ", 1)[1]
        if not e.grafana and name in alerts:
            out.append((f"{e.where} (without its comparison)", condition_operand(e.expr)))
        else:
            out.append((e.where, e.expr))
    return out


def _has_data(result: list[dict[str, Any]]) -> bool:
    return any(not math.isnan(float(r["value"][1])) for r in result)


async def test_every_expression_returns_data(tmp_path: Path) -> None:
    """A failure lists every expression without data at once, with the load that was sent."""
    sources.require_binary("prometheus")
    exprs = _expressions()
    assert len(exprs) > 50, exprs
    async with _stack(tmp_path) as stack:
        t0 = time.monotonic()
        results = await _load(stack.base_url)
        load_s = time.monotonic() - t0
        prom = stack.prometheus
        # Three more scrapes and rule evaluations after the last request, then one instant query each.
        await asyncio.sleep(3.5)
        # Every series the gateway exports, as Prometheus stored it.
        names = set(await asyncio.to_thread(prom.api, "label/__name__/values"))

        def evaluate() -> tuple[list[str], list[str]]:
            failures, errors = [], []
            for where, expr in exprs:
                try:
                    result = prom.query(expr)
                except AssertionError as exc:
                    errors.append(f"{where}: {exc}\n    {expr}")
                    continue
                if not result:
                    failures.append(f"{where}: empty\n    {expr}")
                elif not _has_data(result):
                    failures.append(f"{where}: only NaN ({len(result)} series)\n    {expr}")
            for var in sources.dashboard_variable_queries(sources.DASHBOARDS / "gateway.json"):
                m = re.match(r"\s*label_values\((.+),\s*(\w+)\)\s*$", var.expr)
                assert m, var.expr
                values = prom.api(f"label/{m.group(2)}/values", **{"match[]": m.group(1)})
                if not values:
                    failures.append(f"{var.where}: no values\n    {var.expr}")
            return failures, errors

        failures, errors = await asyncio.to_thread(evaluate)

    summary = "\n".join(f"  {k}: {v}" for k, v in sorted(results.items()))
    report = "\n".join(errors + failures)
    assert not errors and not failures, (
        f"{len(errors)} errors and {len(failures)} expressions without data, of {len(exprs)} "
        f"(load {load_s:.1f} s):\n{report}\n\ngateway series in Prometheus: "
        f"{sorted(n for n in names if n.startswith('gateway'))}\n\nrequests sent:\n{summary}"
    )
    # The load did what it was meant to: every kind of request was sent, and ended as expected.
    sent = {k.split(" ")[0] for k in results}
    assert sent == set(KINDS), sorted(set(KINDS) - sent)
