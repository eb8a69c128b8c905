"""The end-of-run table (rich): the two lenses side by side in separately titled groups, "your
answer (per request)" and "the machine (aggregate)", then errors and the stream check."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table


def _n(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def _level(lv: dict[str, Any], named: bool = True) -> str:
    name = f"c={lv['concurrency']}" if lv["concurrency"] is not None else f"{lv['rate']:g}/s"
    return f"{name} {lv['target']}".strip() if named else name


def render(levels: Sequence[dict[str, Any]]) -> RenderableType:
    named = len({lv["target"] for lv in levels}) > 1
    yours = Table(title="your answer (per request)", title_style="bold")
    for col in ("level", "TTFT p50 ms", "p90", "p99", "ITL p50 ms", "p99", "tok/s p50", "p10", "e2e p50 s", "p99"):
        yours.add_column(col, justify="right")
    machine = Table(title="the machine (aggregate)", title_style="bold")
    for col in ("level", "out tok/s", "req/s", "concurrency", "hit rate", "errors", "lost"):
        machine.add_column(col, justify="right")
    for lv in levels:
        pr, agg = lv["per_request"], lv["aggregate"]
        t, i, s, e = pr["ttft_s"], pr["itl_s"], pr["output_tok_s"], pr["e2e_s"]
        yours.add_row(
            _level(lv, named), _ms(t["p50"]), _ms(t["p90"]), _ms(t["p99"]), _ms(i["p50"]), _ms(i["p99"]),
            _n(s["p50"], 1), _n(s["p10"], 1), _n(e["p50"]), _n(e["p99"]),
        )  # fmt: skip
        errors = ", ".join(f"{k} {v}" for k, v in lv["errors"].items()) or "0"
        hit = lv.get("prefix_hit_rate")
        machine.add_row(
            _level(lv, named), _n(agg["output_tok_s"], 1), _n(agg["requests_s"]), _n(agg["concurrency"], 1),
            "-" if hit is None else f"{hit:.0%}", errors, str(lv["stream_check"]["lost_events"]),
        )  # fmt: skip
    return Group(yours, machine)


def notes(levels: Sequence[dict[str, Any]], slo: dict[str, Any] | None, slo_bound: float) -> list[str]:
    """The lines under the table: the gateway's own figures, the agreement check and the SLO pick."""
    out = []
    for lv in levels:
        gw, ag = lv.get("gateway"), lv.get("agreement")
        if gw is None or ag is None:
            continue
        rel = ag["relative_difference"]
        worst, key = max(((abs(v), k) for k, v in rel.items() if v is not None), default=(0.0, "-"))
        out.append(
            f"{_level(lv, False)}: gateway counted {gw['output_tokens']:.0f} output / "
            f"{gw['prompt_tokens']:.0f} prompt tokens from usage "
            f"(bench: {ag['output_tokens']['bench']} / {ag['prompt_tokens']['bench']}, "
            f"{'equal' if ag['tokens_equal'] else 'DIFFERENT'}); "
            f"means within {worst:.1%} of the gateway's (largest: {key}); "
            f"queue wait {_ms(gw['queue_wait_s_mean'])} ms, "
            f"gateway overhead {_n((gw['overhead_s_mean'] or 0) * 1e6, 0)} us"
        )
    if slo is None:
        out.append(f"no level kept p99 TTFT under {slo_bound:g} s")
    else:
        where = f"concurrency {slo['concurrency']}" if slo["concurrency"] is not None else f"rate {slo['rate']:g}/s"
        out.append(
            f"best under p99 TTFT {slo_bound:g} s: {slo['output_tok_s']:.1f} tok/s aggregate at {where} "
            f"(p99 TTFT {slo['ttft_p99_s']:.2f} s)"
        )
    return out


def ratio_lines(ratios: Sequence[dict[str, Any]]) -> list[str]:
    out = []
    for r in ratios:
        where = f"c={r['concurrency']}" if r["concurrency"] is not None else f"{r['rate']:g}/s"
        parts = [
            f"{name} x{r[key]:.2f}"
            for key, name in (
                ("ttft_p50", "TTFT p50"),
                ("output_tok_s_p50", "tok/s p50"),
                ("aggregate_output_tok_s", "aggregate tok/s"),
                ("prefix_hit_rate", "hit rate"),
            )
            if r[key] is not None
        ]
        out.append(f"{where}: {r['target']} / {r['baseline']}: " + ", ".join(parts))
    return out
