"""`gateway keys`: each client key's token budgets and what it has spent of them this period. With
`redis:` configured it reads the shared counters from Redis (every replica's spend); without, the
counters live in the serving gateway's memory, so it reads `gateway_budget_used_tokens` from that
gateway's /metrics (`--url`)."""

from __future__ import annotations

import asyncio
import datetime
import time

from engines.promtext import read_labelled
from gateway.access.budget import period_of, used_names
from gateway.config import BudgetConfig, ClientKeyConfig, GatewayConfig

Spend = dict[tuple[str, str], tuple[int | None, int | None]]
"""(key name, period) -> (input used, output used); None: unknown."""


async def from_redis(config: GatewayConfig, now: float) -> Spend:
    from redis.asyncio import Redis

    assert config.redis is not None
    redis = Redis.from_url(config.redis.url.get_secret_value(), socket_timeout=config.redis.timeout_s)
    out: Spend = {}
    try:
        for key in config.keys:
            for budget in key.budgets:
                name_in, name_out, _ = used_names(config.redis.key_prefix, key.name, budget, now)
                used_in, used_out = await redis.mget([name_in, name_out])
                out[key.name, budget.period] = (int(used_in or 0), int(used_out or 0))
    finally:
        await redis.aclose()
    return out


def from_metrics(text: str) -> Spend:
    found: dict[tuple[str, str], dict[str, int]] = {}
    for (name, labels), value in read_labelled(text).items():
        if name == "gateway_budget_used_tokens":
            got = dict(labels)
            found.setdefault((got.get("key", ""), got.get("period", "")), {})[got.get("kind", "")] = int(value)
    return {k: (v.get("input"), v.get("output")) for k, v in found.items()}


def _cell(used: int | None, limit: int | None) -> str:
    if limit is None:
        return "-" if used is None else f"{used}"
    return f"{'?' if used is None else used} / {limit}"


def render(keys: tuple[ClientKeyConfig, ...], spend: Spend, now: float, source: str) -> str:
    rows = [("key", "period", "input used / budget", "output used / budget", "resets (UTC)")]
    for key in keys:
        for budget in key.budgets:
            used_in, used_out = spend.get((key.name, budget.period), (None, None))
            rows.append(
                (
                    key.name,
                    budget.period,
                    _cell(used_in, budget.input_tokens),
                    _cell(used_out, budget.output_tokens),
                    _reset(budget, now),
                )
            )
    if len(rows) == 1:
        return "No key has a budget (keys[].budgets)."
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join([*lines, f"(spend from {source})"])


def _reset(budget: BudgetConfig, now: float) -> str:
    at = datetime.datetime.fromtimestamp(period_of(budget.period, now).resets_at, datetime.UTC)
    return at.strftime("%Y-%m-%d %H:%M")


def spend_of(config: GatewayConfig, url: str | None, now: float) -> tuple[Spend, str]:
    """What each key has spent, and where that was read (an OSError when it cannot be)."""
    if config.redis is not None:
        return asyncio.run(from_redis(config, now)), "redis"
    import httpx

    base = url or f"http://{config.server.host}:{config.server.port}"
    r = httpx.get(base.rstrip("/") + "/metrics", timeout=5)
    r.raise_for_status()
    return from_metrics(r.text), f"{base}/metrics: this gateway's memory, as of each key's last request"


def run(config: GatewayConfig, url: str | None) -> int:
    now = time.time()
    try:
        spend, source = spend_of(config, url, now)
    except Exception as exc:  # Redis or the gateway unreachable: say so, in one line
        print(f"gateway keys: cannot read the spend ({type(exc).__name__}: {exc})")
        return 2
    print(render(config.keys, spend, now, source))
    return 0
