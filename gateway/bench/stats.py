"""The bench's arithmetic, pure: percentiles, per-request speeds, aggregate rates over a level's wall
time, Poisson arrival times, and the best level under a TTFT bound. No clock, no I/O."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between order statistics (numpy's
    default); None for no values."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0..100")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def quantiles(values: Sequence[float], qs: Sequence[int]) -> dict[str, float | None]:
    return {f"p{q}": percentile(values, q) for q in qs}


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def poisson_arrivals(rate: float, count: int, seed: int) -> list[float]:
    """``count`` send times (seconds from 0) of a Poisson process of ``rate`` per second: exponential
    gaps, seeded, so the same seed gives the same schedule."""
    if rate <= 0:
        raise ValueError("rate must be > 0")
    rng = random.Random(seed)
    t = 0.0
    out = []
    for _ in range(count):
        t += rng.expovariate(rate)
        out.append(t)
    return out


@dataclass
class Timing:
    """One request as the client saw it: monotonic times and what the stream carried."""

    start: float
    end: float
    first_token: float | None = None
    last_token: float | None = None
    gaps: list[float] = field(default_factory=list)  # between consecutive content chunks
    content_events: int = 0
    completion_tokens: int | None = None  # the usage the engine reported
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    finished: bool = False  # a finish_reason arrived
    done: bool = False  # the stream's final event ([DONE]) arrived
    error: str | None = None  # an error kind, None when the request succeeded

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start

    @property
    def e2e(self) -> float:
        return self.end - self.start

    @property
    def output_tok_s(self) -> float | None:
        """Decode speed: tokens after the first / first-to-last token time (the gateway's definition)."""
        n = self.completion_tokens if self.completion_tokens is not None else self.content_events
        if self.first_token is None or self.last_token is None or n < 2:
            return None
        decode = self.last_token - self.first_token
        return (n - 1) / decode if decode > 0 else None

    @property
    def lost_event(self) -> bool:
        """A stream that did not end with its final event, reported no usage, or carried more content
        chunks than the tokens it reported. Fewer chunks than tokens is not a loss: an engine may put
        several tokens in one chunk (vLLM does when its output runs ahead of the client)."""
        if self.error is not None:
            return False
        if not (self.finished and self.done) or self.completion_tokens is None:
            return True
        return self.content_events > self.completion_tokens

    @property
    def merged_chunks(self) -> bool:
        """Some chunk carried more than one token (chunks < tokens reported)."""
        return self.completion_tokens is not None and self.content_events < self.completion_tokens


def wall_time(timings: Sequence[Timing]) -> float:
    """From the first send to the last answer's end."""
    return (max(t.end for t in timings) - min(t.start for t in timings)) if timings else 0.0


def level_stats(
    timings: Sequence[Timing], concurrency: int | None, rate: float | None, wall_s: float | None = None
) -> dict[str, Any]:
    """One level's figures in bench.json's shape: both lenses, errors and the stream check. ``wall_s``
    (default: first send to last end) is the time the aggregate rates divide by; interleaved rounds
    pass the sum of their own rounds' wall times."""
    ok = [t for t in timings if t.error is None]
    errors: dict[str, int] = {}
    for t in timings:
        if t.error is not None:
            errors[t.error] = errors.get(t.error, 0) + 1
    wall = wall_time(timings) if wall_s is None else wall_s
    out_tokens = sum(t.completion_tokens if t.completion_tokens is not None else t.content_events for t in ok)
    ttft = [x for t in ok if (x := t.ttft) is not None]
    speeds = [x for t in ok if (x := t.output_tok_s) is not None]
    gaps = [g for t in ok for g in t.gaps]
    e2e = [t.e2e for t in ok]
    prompt = sum(t.prompt_tokens or 0 for t in ok)
    cached = sum(t.cached_tokens or 0 for t in ok)
    return {
        "concurrency": concurrency,
        "rate": rate,
        "requests": len(timings),
        "errors": errors,
        "per_request": {
            "ttft_s": quantiles(ttft, (50, 90, 95, 99)),  # p95 for the chart
            "itl_s": quantiles(gaps, (50, 99)),
            "output_tok_s": quantiles(speeds, (50, 10)),
            "e2e_s": quantiles(e2e, (50, 99)),
        },
        "aggregate": {
            "output_tok_s": out_tokens / wall if wall > 0 else None,
            "requests_s": len(ok) / wall if wall > 0 else None,
            "concurrency": sum(e2e) / wall if wall > 0 else None,  # Little's law: mean requests in flight
        },
        "stream_check": {
            "lost_events": sum(t.lost_event for t in ok),
            "merged_chunks": sum(t.merged_chunks for t in ok),
            "tokens_counted": sum(t.content_events for t in ok),
            "tokens_reported": out_tokens,
        },
        "tokens": {"output": out_tokens, "prompt": prompt, "cached_prompt": cached},
        "means": {
            "ttft_s": mean(ttft),
            "itl_s": mean(gaps),
            "output_tok_s": mean(speeds),
            "e2e_s": mean(e2e),
        },
        "wall_s": wall,
    }


def best_under_slo(levels: Sequence[dict[str, Any]], slo_ttft_s: float) -> dict[str, Any] | None:
    """The level with the highest aggregate output tok/s whose p99 TTFT is within the bound."""
    fits = [
        lv
        for lv in levels
        if (p99 := lv["per_request"]["ttft_s"]["p99"]) is not None
        and p99 <= slo_ttft_s
        and lv["aggregate"]["output_tok_s"] is not None
    ]
    if not fits:
        return None
    best = max(fits, key=lambda lv: lv["aggregate"]["output_tok_s"])
    return {
        "slo_ttft_s": slo_ttft_s,
        "concurrency": best["concurrency"],
        "rate": best["rate"],
        "output_tok_s": best["aggregate"]["output_tok_s"],
        "ttft_p99_s": best["per_request"]["ttft_s"]["p99"],
    }


def agreement(level: dict[str, Any], gateway: dict[str, Any] | None) -> dict[str, Any] | None:
    """The bench's figures against the gateway's own over the same level: token totals (equal when
    nothing was lost) and the relative difference of each mean and of the aggregate."""
    if gateway is None:
        return None
    rel: dict[str, float | None] = {}
    for key in ("ttft_s", "itl_s", "output_tok_s", "e2e_s"):
        ours, theirs = level["means"][key], gateway.get(f"{key}_mean")
        rel[key] = None if ours is None or not theirs else ours / theirs - 1
    wall = level["wall_s"]
    ours_agg = level["aggregate"]["output_tok_s"]
    theirs_agg = gateway["output_tokens"] / wall if wall > 0 else None
    rel["aggregate_output_tok_s"] = None if ours_agg is None or not theirs_agg else ours_agg / theirs_agg - 1
    return {
        "output_tokens": {"bench": level["tokens"]["output"], "gateway": gateway["output_tokens"]},
        "prompt_tokens": {"bench": level["tokens"]["prompt"], "gateway": gateway["prompt_tokens"]},
        "tokens_equal": level["tokens"]["output"] == gateway["output_tokens"]
        and level["tokens"]["prompt"] == gateway["prompt_tokens"],
        "relative_difference": rel,
    }


def ratios(levels: Sequence[dict[str, Any]], baseline: str) -> list[dict[str, Any]]:
    """Each target's figures over the baseline target's at the same level (2.0: twice the baseline's)."""

    def pick(lv: dict[str, Any]) -> dict[str, float | None]:
        pr, agg = lv["per_request"], lv["aggregate"]
        return {
            "ttft_p50": pr["ttft_s"]["p50"],
            "ttft_p99": pr["ttft_s"]["p99"],
            "output_tok_s_p50": pr["output_tok_s"]["p50"],
            "aggregate_output_tok_s": agg["output_tok_s"],
            "prefix_hit_rate": lv.get("prefix_hit_rate"),
        }

    base = {(lv["concurrency"], lv["rate"]): pick(lv) for lv in levels if lv.get("target") == baseline}
    out = []
    for lv in levels:
        ref = base.get((lv["concurrency"], lv["rate"]))
        if lv.get("target") == baseline or ref is None:
            continue
        mine = pick(lv)
        out.append(
            {
                "target": lv["target"],
                "baseline": baseline,
                "concurrency": lv["concurrency"],
                "rate": lv["rate"],
                **{k: _over(v, ref[k]) for k, v in mine.items()},
            }
        )
    return out


def _over(value: float | None, base: float | None) -> float | None:
    return value / base if value is not None and base else None
