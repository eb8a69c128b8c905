"""What the per-request histograms cost and how true their quantiles are, for bucket layouts of
different resolution: series and /metrics bytes for the label sets a config gives, the cost of one
observation, and histogram_quantile's error against the exact sample quantile on synthetic data.

    python benchmarks/histogram_cost.py                               # the shipped compose config
    python benchmarks/histogram_cost.py --config deploy/kubernetes/gateway.yaml --replicas 4

Label sets are route x pool x backend for every pool a route names (each backend once per replica
with --replicas, as DNS discovery makes one backend per address). The "coarse" layout is the one
the gateway shipped before (13-16 hand-picked bounds a metric); the others are gateway.metrics's
log_buckets with N bounds per decade over the same ranges as the shipped layout.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import math
import random
import statistics
import sys
import timeit
from collections.abc import Sequence
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry, Histogram, generate_latest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gateway import metrics  # noqa: E402
from gateway.config_loader import parse_config  # noqa: E402

# The coarse layout the fine histograms replaced, for comparison.
COARSE = {
    "gateway_time_to_first_token_seconds": (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0),
    "gateway_inter_token_latency_seconds": (
        *(0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0),
    ),
    "gateway_request_duration_seconds": (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600),
    "gateway_request_output_tokens_per_second": (1, 2, 4, 6, 8, 10, 15, 20, 30, 50, 75, 100, 150, 250, 500, 1000),
}


def layout(per_decade: int) -> dict[str, tuple[float, ...]]:
    """The shipped layout's shape (fine range plus coarse tails) at `per_decade` bounds a decade."""
    lb = metrics.log_buckets
    return {
        "gateway_time_to_first_token_seconds": (0.001, 0.0025, *lb(0.005, 20.0, per_decade), 30.0, 60.0, 120.0),
        "gateway_inter_token_latency_seconds": (0.0005, *lb(0.001, 1.0, per_decade), 2.0, 5.0),
        "gateway_request_duration_seconds": (0.005, 0.01, *lb(0.02, 300.0, per_decade), 600.0, 1200.0),
        "gateway_request_output_tokens_per_second": (0.25, 0.5, *lb(1.0, 1000.0, per_decade), 2000.0, 5000.0),
    }


def label_sets(config_path: Path, replicas: int, labels: Sequence[str]) -> list[tuple[str, ...]]:
    config = parse_config(yaml.safe_load(config_path.read_text()), env={})
    out: set[tuple[str, ...]] = set()
    for route in config.routes:
        for pool_name in route.pools:
            for i, backend in enumerate(config.pools[pool_name].backends):
                for r in range(replicas):
                    name = backend.name or f"b{i}"
                    full = {"route": route.name or route.model, "pool": pool_name, "backend": f"{name}-{r}"}
                    out.add(tuple(full[k] for k in labels))
    return sorted(out)


def scrape_cost(
    buckets: dict[str, tuple[float, ...]], sets: list[tuple[str, ...]], labels: Sequence[str]
) -> dict[str, float]:
    registry = CollectorRegistry()
    fine = []
    for name, bounds in buckets.items():
        h = metrics.FineHistogram(name, "x", labels, buckets=bounds, registry=registry)
        fine.append(h)
        for s in sets:
            h.labels(*s).observe(0.1)
    text = generate_latest(registry)
    caches: list[dict[tuple[str, ...], list[str]]] = [{} for _ in fine]

    def render() -> str:
        return "".join(h.render(c) for h, c in zip(fine, caches, strict=True))

    render()
    fast = min(timeit.repeat(render, number=3, repeat=3)) / 3
    lines = [ln for ln in text.decode().splitlines() if ln and not ln.startswith("#")]
    t = min(timeit.repeat(lambda: generate_latest(registry), number=3, repeat=3)) / 3
    return {
        "buckets": float(sum(len(b) + 1 for b in buckets.values())),  # + the +Inf bucket
        "series": float(sum(1 for ln in lines if not ln.split("{")[0].endswith("_created"))),
        "bytes": float(len(text)),
        "gzip_bytes": float(len(gzip.compress(text, 6))),
        "render_ms": t * 1000,
        "fast_render_ms": fast * 1000,
    }


def observe_cost(bounds: tuple[float, ...], cls: type[Histogram]) -> float:
    """Seconds for one observe() on a labelled child, values spread over the bounds' range."""
    h = cls("probe", "x", ("a",), buckets=bounds, registry=CollectorRegistry()).labels("x")
    values = [bounds[0] * (bounds[-1] / bounds[0]) ** random.random() for _ in range(1000)]

    def run() -> None:
        for v in values:
            h.observe(v)

    return min(timeit.repeat(run, number=20, repeat=5)) / 20 / len(values)


def histogram_quantile(q: float, bounds: Sequence[float], values: Sequence[float]) -> float:
    """Prometheus's bucketQuantile over the values' cumulative bucket counts (+Inf appended)."""
    counts = [0] * (len(bounds) + 1)
    for v in values:
        counts[bisect.bisect_left(bounds, v)] += 1
    cum: list[int] = []
    for c in counts:
        cum.append((cum[-1] if cum else 0) + c)
    rank = q * cum[-1]
    b = bisect.bisect_left(cum, rank)
    if b == len(bounds):
        return bounds[-1]
    lower, below = (0.0, 0) if b == 0 else (bounds[b - 1], cum[b - 1])
    return lower + (bounds[b] - lower) * (rank - below) / (cum[b] - below)


def sample_quantile(q: float, values: Sequence[float]) -> float:
    """The median, or the nearest-rank quantile (the q * n-th smallest value)."""
    xs = sorted(values)
    return statistics.median(xs) if q == 0.5 else xs[max(0, math.ceil(q * len(xs)) - 1)]


def quantile_error(per_decade: int, trials: int = 200) -> dict[str, float]:
    """Worst |histogram_quantile / sample quantile - 1| over log-normal samples of 300 values, from
    bunched (sigma 0.3 %) to spread (sigma 100 %), at random positions against the bounds."""
    bounds = metrics.log_buckets(1e-3, 1e3, per_decade)
    rng = random.Random(16)
    worst = {"p50": 0.0, "p95": 0.0}
    for sigma in (0.003, 0.01, 0.03, 0.1, 0.3, 1.0):
        for _ in range(trials):
            mu = math.log(0.05) + rng.random()
            xs = [math.exp(rng.gauss(mu, sigma)) for _ in range(300)]
            for key, q in (("p50", 0.5), ("p95", 0.95)):
                err = abs(histogram_quantile(q, bounds, xs) / sample_quantile(q, xs) - 1)
                worst[key] = max(worst[key], err)
    return worst


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=REPO / "deploy" / "compose" / "gateway.yaml")
    parser.add_argument("--replicas", type=int, default=1, help="addresses per backend (DNS discovery)")
    parser.add_argument("--per-decade", default="30,60,120", help="fine layouts to compare")
    args = parser.parse_args(argv)
    layouts: dict[str, dict[str, tuple[float, ...]]] = {"coarse (before)": COARSE}
    for n in (int(x) for x in args.per_decade.split(",")):
        layouts[f"{n}/decade (r={10 ** (1 / n):.4f})"] = layout(n)
    # The label sets with backend (the older layout) and without it (as shipped).
    full, by_route = ("route", "pool", "backend"), ("route", "pool")
    sets_full = label_sets(args.config, args.replicas, full)
    sets_route = label_sets(args.config, args.replicas, by_route)
    print(
        f"{args.config}, {args.replicas} replica(s) a backend: {len(sets_full)} (route, pool, "
        f"backend) label sets, {len(sets_route)} (route, pool)\n"
    )
    print(
        "| layout | buckets, 4 histograms | series | /metrics bytes | gzip | render ms (generate_latest / render) "
        "| series, (route, pool) as shipped | "
        "bytes, (route, pool) | observe µs (linear / bisect) | worst p50 / p95 error |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, buckets in layouts.items():
        full_cost = scrape_cost(buckets, sets_full, full)
        route_cost = scrape_cost(buckets, sets_route, by_route)
        ttft = buckets["gateway_time_to_first_token_seconds"]
        linear, fast = observe_cost(ttft, Histogram) * 1e6, observe_cost(ttft, metrics.FineHistogram) * 1e6
        per = name.split("/")[0]
        err = quantile_error(int(per)) if per.isdigit() else {"p50": math.nan, "p95": math.nan}
        print(
            f"| {name} | {full_cost['buckets']:.0f} | {full_cost['series']:,.0f} | {full_cost['bytes']:,.0f} | "
            f"{full_cost['gzip_bytes']:,.0f} | {full_cost['render_ms']:.1f} / {full_cost['fast_render_ms']:.1f} | "
            f"{route_cost['series']:,.0f} | "
            f"{route_cost['bytes']:,.0f} | {linear:.2f} / {fast:.2f} | {err['p50']:.2%} / {err['p95']:.2%} |"
        )
    typical = {
        "gateway_time_to_first_token_seconds": 0.2,
        "gateway_inter_token_latency_seconds": 0.02,
        "gateway_request_duration_seconds": 2.0,
        "gateway_request_output_tokens_per_second": 40.0,
    }
    shipped = layout(metrics.FINE_PER_DECADE)
    print(
        "\n| one observe() of a typical value | before: coarse, Histogram | shipped bounds, Histogram "
        "(linear scan) | shipped bounds, FineHistogram (bisect) |"
    )
    print("|---|---|---|---|")
    for name, v in typical.items():
        costs = [
            one_observe(Histogram, COARSE[name], v),
            one_observe(Histogram, shipped[name], v),
            one_observe(metrics.FineHistogram, shipped[name], v),
        ]
        print(f"| {name} ({v:g}) | " + " | ".join(f"{c * 1e9:.0f} ns" for c in costs) + " |")
    return 0


def one_observe(cls: type[Histogram], bounds: tuple[float, ...], value: float) -> float:
    h = cls("probe", "x", ("route", "pool", "backend"), buckets=bounds, registry=CollectorRegistry())
    child = h.labels("r", "p", "b")
    return min(timeit.repeat(lambda: child.observe(value), number=20000, repeat=7)) / 20000


if __name__ == "__main__":
    sys.exit(main())
