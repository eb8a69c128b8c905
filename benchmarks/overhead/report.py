"""The direct run's figures as one Markdown table, with the fixed bars of docs/benchmarks.md ("The direct
run") and a verdict for each."""

from __future__ import annotations

import argparse
from typing import Any

# The direct run's fixed bars: the gateway on one core, against absolute figures, not the floor.
BAR_RPS = 3500
BAR_US_PER_REQ = 285
BAR_ADDED_P50_MS = 1.5
BAR_US_PER_TOKEN = 60
BAR_P99_STREAM_SLACK = 0.10
BAR_RSS_IDLE_MB = 80


def fmt(value: float | None, digits: int = 0) -> str:
    if value is None or value != value:
        return "n/a"
    return f"{value:,.{digits}f}"


def verdict(ok: bool) -> str:
    return "**pass**" if ok else "**FAIL**"


def render(r: dict[str, Any], a: argparse.Namespace) -> str:
    md, mg = r["max_direct"], r["max_gateway"]
    ld, lg = r["lat_direct"], r["lat_gateway"]
    fd, fg = r["fast_direct"], r["fast_gateway"]
    rd, rg = r["real_direct"], r["real_gateway"]
    ideal = a.tokens * a.delay_ms / 1e3
    added_p50 = lg["p50_ms"] - ld["p50_ms"]
    added_p99 = lg["p99_ms"] - ld["p99_ms"]
    p99_ok = rg["p99_s"] <= ideal * (1 + BAR_P99_STREAM_SLACK)
    note = " (profiled: py-spy was sampling the gateway)" if a.profile is not None else ""
    rows = [
        "| test | metric | direct | via gateway | bar | verdict |",
        "|---|---|---:|---:|---|---|",
        f"| (1) non-stream, wrk -t1 -c{a.connections} | req/s | {fmt(md['rps'])} | {fmt(mg['rps'])} | "
        f"≥ {BAR_RPS:,} | {verdict(mg['rps'] >= BAR_RPS)} |",
        f"| | CPU µs per request (upstream / gateway) | {fmt(md['cpu_us_per_req'], 1)} (nginx) | "
        f"{fmt(mg['cpu_us_per_req'], 1)} | ≤ {BAR_US_PER_REQ} | {verdict(mg['cpu_us_per_req'] <= BAR_US_PER_REQ)} |",
        f"| | gateway core busy | | {mg['cpu_util']:.0%} | | |",
        f"| | latency p50 / p99 under max load, ms | {md['p50_us'] / 1e3:.2f} / {md['p99_us'] / 1e3:.2f} | "
        f"{mg['p50_us'] / 1e3:.2f} / {mg['p99_us'] / 1e3:.2f} | | |",
        f"| | errors (socket / non-2xx) | {md['socket_errors']} / {md['non2xx']} | "
        f"{mg['socket_errors']} / {mg['non2xx']} | 0 | |",
        f"| (2) fixed {a.rate:.0f} req/s, open loop | latency p50, ms | {ld['p50_ms']:.2f} | {lg['p50_ms']:.2f} | "
        f"added ≤ {BAR_ADDED_P50_MS} | {verdict(added_p50 <= BAR_ADDED_P50_MS)} (+{added_p50:.2f}) |",
        f"| | latency p99, ms | {ld['p99_ms']:.2f} | {lg['p99_ms']:.2f} | | (+{added_p99:.2f}) |",
        f"| | achieved req/s; errors | {fmt(ld['rate'])}; {ld['errors']} | {fmt(lg['rate'])}; {lg['errors']} | | |",
        f"| | gateway CPU µs per request at this rate | | {fmt(lg['cpu_us_per_req'], 1)} | | |",
        f"| (3) fast stream, {a.chunks} events/response, no delay | responses/s | {fmt(fd['rps'])} | "
        f"{fmt(fg['rps'])} | | |",
        f"| | events/s | {fmt(fd['events_per_s'])} | {fmt(fg['events_per_s'])} | | |",
        f"| | CPU µs per event (upstream / gateway) | {fmt(fd['cpu_us_per_event'], 2)} (nginx) | "
        f"{fmt(fg['cpu_us_per_event'], 2)} | | |",
        f"| (4) realistic stream, {a.streams} streams x {a.tokens} tokens @ {a.delay_ms:g} ms | "
        f"CPU µs per token (upstream / gateway) | {fmt(rd['cpu_us_per_token'], 1)} (paced upstream) | "
        f"{fmt(rg['cpu_us_per_token'], 1)} | ≤ {BAR_US_PER_TOKEN} | "
        f"{verdict(rg['cpu_us_per_token'] <= BAR_US_PER_TOKEN)} |",
        f"| | p99 stream time, s (ideal {ideal:g}) | {rd['p99_s']:.3f} (+{rd['p99_s'] / ideal - 1:.1%}) | "
        f"{rg['p99_s']:.3f} (+{rg['p99_s'] / ideal - 1:.1%}) | ≤ {ideal * (1 + BAR_P99_STREAM_SLACK):g} | "
        f"{verdict(p99_ok)} |",
        f"| | p50 stream time, s; TTFT p99, ms | {rd['p50_s']:.3f}; {rd['ttft_p99_ms']:.1f} | "
        f"{rg['p50_s']:.3f}; {rg['ttft_p99_ms']:.1f} | | |",
        f"| | streams ok / failed; gateway core busy | {rd['streams']} / {rd['failures']} | "
        f"{rg['streams']} / {rg['failures']}; {rg['cpu_util']:.0%} | | |",
        f"| (5) gateway RSS | idle, MB | | {r['rss_idle_mb']:.1f} | ≤ {BAR_RSS_IDLE_MB} | "
        f"{verdict(r['rss_idle_mb'] <= BAR_RSS_IDLE_MB)} |",
        f"| | after the load (peak), MB | | {r['rss_after_mb']:.1f} ({r['rss_peak_mb']:.1f}) | | |",
    ]
    if "max_gateway_info" in r:
        mi = r["max_gateway_info"]
        rows.append(
            f"| (6) as (1), --log-level info (access log on) | req/s; CPU µs per request | | "
            f"{fmt(mi['rps'])}; {fmt(mi['cpu_us_per_req'], 1)} | | {mi['log_lines']:,} log lines |"
        )
    loop = {
        "as-is": "as shipped (`gateway serve`)",
        "uvloop": "with uvloop forced (gateway_uvloop.py)",
        "uvloop-gc": "with uvloop forced and GC tuned (gateway_uvloop.py, BENCH_GC_TUNE=1)",
    }[a.variant]
    nice = f", nice {a.nice}" if a.nice else ""
    head = (
        f"Gateway {loop}{nice} on core {r['cores']['gateway']} (taskset), upstreams and load on core "
        f"{r['cores']['load']}; --log-level warning unless noted; {r['elapsed_s']:.0f} s run{note}; "
        f"code at {r['git']}.\n"
    )
    phases = (
        ("(1)", "max_gateway"),
        ("(2)", "lat_gateway"),
        ("(3)", "fast_gateway"),
        ("(4)", "real_gateway"),
        ("(6)", "max_gateway_info"),
    )
    noise = [(label, r[key]) for label, key in phases if key in r]
    foot = (
        "\nMachine noise in each gateway phase: run-queue wait of the gateway / of the upstreams (share of "
        "wall time spent ready but waiting for the core), and other processes' CPU on the gateway core / "
        "on the load core: "
        + "; ".join(
            f"{label} {n['runq_wait_gw']:.1%} / {n['runq_wait_load']:.1%}, {n['foreign_gw_core']:.0%} / "
            f"{n['foreign_load_core']:.0%}"
            for label, n in noise
        )
        + "."
    )
    worst = max(max(n["runq_wait_gw"] * 10, n["runq_wait_load"] * 10, n["foreign_gw_core"]) for _, n in noise)
    if "gc" in r:
        foot += (
            "\nGarbage collections in the gateway over (1)-(5): "
            + ", ".join(f"gen {g}: {s['collections']:,} ({s['seconds']:.2f} s)" for g, s in r["gc"].items())
            + "."
        )
    if worst > 0.05:
        foot += (
            " **The machine was not quiet: other processes took the cores and their caches, so req/s and "
            "latency are pessimistic and CPU µs inflated, most at low load. Rerun when it is idle, or with "
            "--nice -19.**"
        )
    return head + "\n" + "\n".join(rows) + "\n" + foot
