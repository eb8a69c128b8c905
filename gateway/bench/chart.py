"""bench.png (matplotlib, an optional extra): per-request and aggregate tok/s against concurrency on
one plot with two labelled axes, and TTFT p95 on a second."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

NO_MATPLOTLIB = "bench.png not written: matplotlib is not installed (pip install -e '.[bench]' for plots)"


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot(path: Path, levels: Sequence[dict[str, Any]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    closed = [lv for lv in levels if lv["concurrency"] is not None]
    key, xlabel = ("concurrency", "concurrency (users)") if closed else ("rate", "arrival rate (requests/s)")
    points = closed or list(levels)
    targets = list(dict.fromkeys(lv["target"] for lv in points))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 8), sharex=True, height_ratios=(3, 2))
    right = top.twinx()
    blue, orange = "tab:blue", "tab:orange"
    styles = ("o-", "s--", "^:", "d-.")
    handles = []
    for i, target in enumerate(targets):
        rows = sorted((lv for lv in points if lv["target"] == target), key=lambda lv: lv[key])
        xs = [lv[key] for lv in rows]
        suffix = f" ({target})" if len(targets) > 1 else ""
        style = styles[i % len(styles)]
        per = [lv["per_request"]["output_tok_s"]["p50"] for lv in rows]
        agg = [lv["aggregate"]["output_tok_s"] for lv in rows]
        ttft = [lv["per_request"]["ttft_s"].get("p95") for lv in rows]
        handles += top.plot(xs, per, style, color=blue, label=f"per request, p50{suffix}")
        handles += right.plot(xs, agg, style, color=orange, label=f"aggregate{suffix}")
        bottom.plot(xs, ttft, style, color="tab:red", label=f"TTFT p95{suffix}")
    top.set_ylabel("your answer: output tok/s per request", color=blue)
    right.set_ylabel("the machine: aggregate output tok/s", color=orange)
    top.tick_params(axis="y", labelcolor=blue)
    right.tick_params(axis="y", labelcolor=orange)
    top.set_ylim(bottom=0)
    right.set_ylim(bottom=0)
    top.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False)
    fig.suptitle(title)
    top.grid(alpha=0.3)
    bottom.set_ylabel("time to first token, p95 (s)")
    bottom.set_xlabel(xlabel)
    bottom.set_ylim(bottom=0)
    bottom.grid(alpha=0.3)
    bottom.legend(loc="upper left")
    ticks = sorted({lv[key] for lv in points})
    if key == "concurrency" and ticks[-1] / max(1, ticks[0]) >= 8:
        bottom.set_xscale("log", base=2)
    bottom.set_xticks(ticks, [f"{x:g}" for x in ticks])
    bottom.minorticks_off()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
