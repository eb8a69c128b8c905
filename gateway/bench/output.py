"""bench.json (every figure, in the shape docs/bench.md gives) and bench.csv (one flat row per level and target)."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CSV_COLUMNS = (
    "target", "concurrency", "rate", "requests",
    "ttft_s.p50", "ttft_s.p90", "ttft_s.p95", "ttft_s.p99", "itl_s.p50", "itl_s.p99",
    "output_tok_s.p50", "output_tok_s.p10", "e2e_s.p50", "e2e_s.p99",
    "aggregate.output_tok_s", "aggregate.requests_s", "aggregate.concurrency",
    "errors", "lost_events", "prefix_hit_rate", "queue_wait_s_mean", "gateway_overhead_s_mean",
    "gateway_output_tokens", "bench_output_tokens",
)  # fmt: skip


def row(lv: dict[str, Any]) -> dict[str, Any]:
    pr = lv["per_request"]
    out: dict[str, Any] = {"target": lv["target"], "concurrency": lv["concurrency"], "rate": lv["rate"]}
    out["requests"] = lv["requests"]
    for group in ("ttft_s", "itl_s", "output_tok_s", "e2e_s"):
        for q, v in pr[group].items():
            out[f"{group}.{q}"] = v
    for k, v in lv["aggregate"].items():
        out[f"aggregate.{k}"] = v
    out["errors"] = sum(lv["errors"].values())
    out["lost_events"] = lv["stream_check"]["lost_events"]
    for k in ("prefix_hit_rate", "queue_wait_s_mean", "gateway_overhead_s_mean"):
        out[k] = lv.get(k)
    out["gateway_output_tokens"] = lv["gateway"]["output_tokens"] if lv.get("gateway") else None
    out["bench_output_tokens"] = lv["tokens"]["output"]
    return out


def write(out_dir: Path, report: dict[str, Any], levels: Sequence[dict[str, Any]]) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    js, cs = out_dir / "bench.json", out_dir / "bench.csv"
    js.write_text(json.dumps(report, indent=2) + "\n")
    with cs.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for lv in levels:
            writer.writerow({k: ("" if v is None else v) for k, v in row(lv).items()})
    return [js, cs]
