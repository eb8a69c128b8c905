"""Metric truth, the light version of benchmarks/metric_truth.py: the gateway (its own process) in
front of a REAL vLLM, at concurrency 1 and 4, 10 s each. The gateway's token counters equal the
client's summed usage and vLLM's own counters exactly; its TTFT and end-to-end means (Δ_sum/Δ_count)
are within 5 % of what the client measured; and the aggregate tok/s that rate() gives is within 10 %
of the client's tokens / wall time.

With the `prometheus` binary the gateway's figures are read through a real Prometheus scraping it
every second (and checked equal to the gateway's own /metrics); without it, from /metrics, and the
rate is then Δcounter / wall time. Medians are not asserted: histogram_quantile interpolates inside
a bucket, and the benchmark shows by how much.

The prompts are ~2,700 tokens so that TTFT is tens of milliseconds even for the tiny model: the
client's clock also holds ~1 ms of loopback and HTTP client per request, which would be more than
5 % of a 15 ms TTFT."""

from __future__ import annotations

import functools
import importlib.util
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def _benchmark() -> ModuleType:
    name = "metric_truth"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / "metric_truth.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _row(level: Any, prefix: str) -> Any:
    return next(r for r in level.rows if r.quantity.startswith(prefix))


def test_gateway_metrics_match_client_and_vllm(engine_launcher: Callable[..., Any], tmp_path: Path) -> None:
    mt = _benchmark()
    launch = functools.partial(engine_launcher, "vllm")
    with_prometheus = shutil.which("prometheus") is not None
    failures: list[str] = []
    tables: list[str] = []
    with mt.stack(tmp_path, max_num_seqs=4, max_model_len=4096, with_prometheus=with_prometheus, launch=launch) as (
        vllm,
        gw,
        prom,
    ):
        mt.warm_up(gw, 32)
        for concurrency in (1, 4):
            level = mt.run_level(
                gw, vllm, prom, concurrency, duration=10.0, max_requests=200, max_tokens=32, prompt_words=700
            )
            tables.append(mt.markdown(level))
            failures += [f"c={concurrency}: {name}" for name, ok in level.checks.items() if not ok]
            for prefix in ("output tokens", "prompt tokens"):
                r = _row(level, prefix)
                if not (r.client == r.gateway == r.vllm > 0):
                    failures.append(f"c={concurrency}: {prefix}: client {r.client}, gateway {r.gateway}, vLLM {r.vllm}")
            for prefix, tolerance in (("TTFT mean", 0.05), ("e2e mean", 0.05), ("aggregate output tok/s", 0.10)):
                r = _row(level, prefix)
                if not abs(r.diff) <= tolerance:
                    failures.append(
                        f"c={concurrency}: {prefix}: client {r.client:.4f}, gateway {r.gateway:.4f} "
                        f"({r.diff:+.2%}, allowed ±{tolerance:.0%})"
                    )
    report = "\n\n".join(tables)
    print(report)
    assert not failures, "\n".join(failures) + "\n\n" + report
