"""Runs the measured levels: for each concurrency or rate, each target in turn, in interleaved
rounds, with /metrics scraped before and after; returns one figures dict per (level, target)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from gateway.bench.client import LoadClient
from gateway.bench.scrape import Scraper, Snapshot, engine_figures, gateway_figures
from gateway.bench.stats import Timing, agreement, level_stats, poisson_arrivals, wall_time
from gateway.bench.workload import WorkloadSpec, bodies


@dataclass(frozen=True)
class Level:
    concurrency: int | None = None  # closed loop: this many users, each waiting for its answer
    rate: float | None = None  # open loop: Poisson arrivals per second

    @property
    def label(self) -> str:
        return f"concurrency {self.concurrency}" if self.concurrency is not None else f"rate {self.rate:g}/s"


@dataclass(frozen=True)
class Target:
    name: str
    url: str
    model: str
    engine_metrics: list[str] = field(default_factory=list)
    route: str | None = None  # filter the gateway's metrics on this route (several models on one gateway)


@dataclass(frozen=True)
class Plan:
    levels: list[Level]
    workload: WorkloadSpec
    requests: int | None
    duration_s: float | None
    warmup: int
    rounds: int
    api_key: str | None


# (target, level, done in this level, total or None, the request just finished)
OnRequest = Callable[[Target, Level, int, int | None, Timing], None]
OnLevel = Callable[[Target, Level, int | None], None]


def requests_for(plan: Plan, level: Level) -> int | None:
    """Requests per level per target: --requests, else (without --duration) max(20, 4 x concurrency)."""
    if plan.requests is not None:
        return plan.requests
    if plan.duration_s is not None:
        return None
    return max(20, 4 * (level.concurrency or 0))


class Runner:
    """Holds one client per target (its pool sized to the largest concurrency) and each target's
    workload stream, so every target gets the same sequence of request bodies."""

    def __init__(self, plan: Plan, targets: list[Target]) -> None:
        self.plan = plan
        self.targets = targets
        self._bodies: dict[str, Iterator[dict[str, Any]]] = {t.name: bodies(plan.workload, t.model) for t in targets}

    async def run(self, on_level: OnLevel, on_request: OnRequest) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for level in self.plan.levels:
            out.extend(await self._level(level, on_level, on_request))
        return out

    async def _level(self, level: Level, on_level: OnLevel, on_request: OnRequest) -> list[dict[str, Any]]:
        plan = self.plan
        limit = level.concurrency or 0  # the open loop must never wait for a connection
        total = requests_for(plan, level)
        rounds = max(1, plan.rounds if len(self.targets) > 1 else 1)
        per_round = None if total is None else math.ceil(total / rounds)
        duration = None if plan.duration_s is None else plan.duration_s / rounds
        async with contextlib.AsyncExitStack() as stack:
            clients = [await stack.enter_async_context(LoadClient(t.url, plan.api_key, limit)) for t in self.targets]
            scrapers = [Scraper(c.session, t.url, t.engine_metrics) for c, t in zip(clients, self.targets, strict=True)]
            for t, c in zip(self.targets, clients, strict=True):
                await c.connect(level.concurrency or 1)
                if plan.warmup:
                    await c.closed_loop(
                        self._bodies[t.name], level.concurrency or 1, plan.warmup, None, lambda _t: None
                    )
            before: list[Snapshot] = [await s.snapshot() for s in scrapers]
            timings: dict[str, list[Timing]] = {t.name: [] for t in self.targets}
            counts = dict.fromkeys(timings, 0)
            walls = dict.fromkeys(timings, 0.0)
            for t in self.targets:
                on_level(t, level, total)
            for r in range(rounds):
                for t, c in zip(self.targets, clients, strict=True):
                    count = None if per_round is None or total is None else min(per_round, total - r * per_round)
                    if count is not None and count <= 0:
                        continue

                    def progress(timing: Timing, t: Target = t) -> None:
                        counts[t.name] += 1
                        on_request(t, level, counts[t.name], total, timing)

                    if level.concurrency is not None:
                        got = await c.closed_loop(self._bodies[t.name], level.concurrency, count, duration, progress)
                    else:
                        assert level.rate is not None
                        n = count if count is not None else math.ceil(level.rate * (duration or 0)) + 1
                        arrivals = poisson_arrivals(level.rate, n, seed=plan.workload.seed + r)
                        got = await c.open_loop(self._bodies[t.name], arrivals, duration, progress)
                    timings[t.name].extend(got)
                    walls[t.name] += wall_time(got)
            results = []
            for t, s, b in zip(self.targets, scrapers, before, strict=True):
                after = await s.settled(b, len(timings[t.name]), t.route)
                results.append(self._figures(t, level, timings[t.name], walls[t.name], b, after))
            return results

    def _figures(
        self, t: Target, level: Level, timings: list[Timing], wall: float, b: Snapshot, a: Snapshot
    ) -> dict[str, Any]:
        lv = level_stats(timings, level.concurrency, level.rate, wall)
        gw = gateway_figures(b.gateway, a.gateway, t.route)
        eng = engine_figures(b.engines, a.engines) if t.engine_metrics else None
        prompt = lv["tokens"]["prompt"]
        usage_hit = lv["tokens"]["cached_prompt"] / prompt if prompt else None
        engine_hit = eng["prefix_hit_rate"] if eng else None
        return {
            "target": t.name,
            **lv,
            "prefix_hit_rate": engine_hit if engine_hit is not None else usage_hit,
            "cached_prompt_share": usage_hit,  # from the usage the engines reported (cached_tokens)
            "queue_wait_s_mean": gw["queue_wait_s_mean"] if gw else None,
            "gateway_overhead_s_mean": gw["overhead_s_mean"] if gw else None,
            "gateway": gw,
            "engines": eng,
            "agreement": agreement(lv, gw),
        }
