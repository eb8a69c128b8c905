"""Scrapes of the gateway's /metrics (and the engines', where given) before and after a level, and
what their difference says: token totals, per-request means, queue wait, gateway overhead and the
engines' prefix-cache hit rate over the run."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from engines.promtext import read_labelled

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    return read_labelled(text)


def total(samples: Samples, name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= lab)


@dataclass
class Snapshot:
    gateway: Samples = field(default_factory=dict)
    engines: list[Samples] = field(default_factory=list)


def _delta(after: Samples, before: Samples, name: str, **labels: str) -> float:
    return total(after, name, **labels) - total(before, name, **labels)


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def gateway_figures(before: Samples, after: Samples, route: str | None = None) -> dict[str, Any] | None:
    """The gateway's own account of the run; None when the target exports no gateway_ metrics."""
    if not any(n.startswith("gateway_") for n, _ in after):
        return None
    lab = {"route": route} if route else {}

    def mean(hist: str, **extra: str) -> float | None:
        return _ratio(
            _delta(after, before, f"{hist}_sum", **lab, **extra), _delta(after, before, f"{hist}_count", **lab, **extra)
        )

    hit = [
        v for (n, labels), v in after.items() if n == "gateway_backend_load" and ("signal", "prefix_hit_rate") in labels
    ]
    return {
        "requests": _delta(after, before, "gateway_requests_total", **lab),
        "output_tokens": _delta(after, before, "gateway_output_tokens_total", **lab),
        "prompt_tokens": _delta(after, before, "gateway_prompt_tokens_total", **lab, source="usage"),
        "prompt_tokens_estimated": _delta(after, before, "gateway_prompt_tokens_total", **lab, source="estimated"),
        "ttft_s_mean": mean("gateway_time_to_first_token_seconds"),
        "itl_s_mean": mean("gateway_inter_token_latency_seconds"),
        "e2e_s_mean": mean("gateway_request_duration_seconds"),
        "output_tok_s_mean": mean("gateway_request_output_tokens_per_second"),
        "queue_wait_s_mean": mean("gateway_queue_wait_seconds"),
        "overhead_s_mean": mean("gateway_overhead_seconds"),
        "relay_s_per_chunk": _ratio(
            _delta(after, before, "gateway_relay_overhead_seconds_total", **lab),
            _delta(after, before, "gateway_relay_chunks_total", **lab),
        ),
        "backend_prefix_hit_rate": sum(hit) / len(hit) if hit else None,  # the engines' own, since they started
    }


def engine_figures(before: Sequence[Samples], after: Sequence[Samples]) -> dict[str, Any] | None:
    """Prefix-cache hit rate (share of prompt tokens, or of vLLM's queried tokens, found cached) and
    mean queue time, summed over the engines given, in whichever flavour each speaks."""
    if not after:
        return None
    hits = queries = queue_sum = queue_n = 0.0
    for b, a in zip(before, after, strict=True):
        if any(n.startswith("vllm:") for n, _ in a):
            hits += _delta(a, b, "vllm:prefix_cache_hits_total")
            queries += _delta(a, b, "vllm:prefix_cache_queries_total")
            queue_sum += _delta(a, b, "vllm:request_queue_time_seconds_sum")
            queue_n += _delta(a, b, "vllm:request_queue_time_seconds_count")
        elif any(n.startswith("sglang:") for n, _ in a):
            hits += _delta(a, b, "sglang:cached_tokens_total")
            queries += _delta(a, b, "sglang:prompt_tokens_total")
        elif any(n.startswith("llamacpp:") for n, _ in a):
            cached = _delta(a, b, "llamacpp:prompt_tokens_cached_total")
            hits += cached
            queries += cached + _delta(a, b, "llamacpp:prompt_tokens_total")
    return {"prefix_hit_rate": _ratio(hits, queries), "queue_s_mean": _ratio(queue_sum, queue_n)}


class Scraper:
    """Fetches /metrics of the target and of each engine URL; a failed scrape is an empty one."""

    def __init__(self, session: aiohttp.ClientSession, target: str, engines: Sequence[str]) -> None:
        self.session = session
        self.gateway_url = target.rstrip("/").removesuffix("/v1") + "/metrics"
        self.engine_urls = [u if u.rstrip("/").endswith("/metrics") else u.rstrip("/") + "/metrics" for u in engines]

    async def _get(self, url: str) -> Samples:
        try:
            async with self.session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as resp:
                if resp.status != 200:
                    return {}
                return parse(await resp.text())
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return {}

    async def snapshot(self) -> Snapshot:
        gateway, *engines = await asyncio.gather(self._get(self.gateway_url), *(self._get(u) for u in self.engine_urls))
        return Snapshot(gateway, list(engines))

    async def settled(self, before: Snapshot, requests: int, route: str | None, timeout_s: float = 5.0) -> Snapshot:
        """A snapshot once the gateway has accounted for ``requests`` more requests (it records a
        request just after its last byte), or whatever it has after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            snap = await self.snapshot()
            done = _delta(snap.gateway, before.gateway, "gateway_requests_total", **({"route": route} if route else {}))
            if done >= requests or not snap.gateway or time.monotonic() > deadline:
                return snap
            await asyncio.sleep(0.05)


def route_of(samples: Mapping[tuple[str, frozenset[tuple[str, str]]], float], model: str | None) -> str | None:
    """The route label to filter on: the model's name when the gateway has a route by that name."""
    if model is None:
        return None
    for (name, labels), _ in samples.items():
        if name == "gateway_requests_total" and ("route", model) in labels:
            return model
    return None
