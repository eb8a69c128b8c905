"""`gateway bench`'s command line: the flags, the targets they name (URLs, models on one gateway,
or simulated stacks with different policies), and the run from first level to files on disk."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.bench.workload import BUILTIN

if TYPE_CHECKING:
    from rich.console import Console

DEFAULT_TARGET = "http://127.0.0.1:4000"
POLICIES = ("prefix_affinity", "round_robin", "least_load")
PRESETS = ("seed", "demo", "fast")  # fast: the tests' preset


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from exc
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: each concurrency must be at least 1")
    return values


def _floats(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from exc
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: each rate must be above 0")
    return values


def _positive(kind: type[int] | type[float]) -> Any:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from exc
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be above 0")
        return value

    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=DEFAULT_TARGET, help="the gateway, or any OpenAI-compatible URL")
    p.add_argument("--model", default=None, help="model name (default: the target's first in /v1/models)")
    p.add_argument("--api-key", default=None, help="bearer key (default: $OPENAI_API_KEY)")
    p.add_argument("--workload", default="chat", help="chat, agent, long-context, or a JSONL file of request bodies")
    p.add_argument("--prompt-tokens", type=_positive(int), default=None, help="prompt length (per turn for agent)")
    p.add_argument("--output-tokens", type=_positive(int), default=64, help="max_tokens, with EOS ignored")
    p.add_argument("--no-ignore-eos", action="store_true", help="do not send ignore_eos/min_tokens")
    p.add_argument("--concurrency", type=_ints, default=None, help="closed-loop sweep, e.g. 1,4,16,32")
    p.add_argument("--rate", type=_floats, default=None, help="open-loop Poisson arrivals per second, e.g. 1,2")
    span = p.add_mutually_exclusive_group()
    span.add_argument("--requests", type=_positive(int), default=None, help="requests per level")
    span.add_argument("--duration", type=_positive(float), default=None, help="seconds per level")
    p.add_argument("--warmup", type=int, default=0, help="unmeasured requests before each level")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench-out", help="directory for bench.json, bench.csv, bench.png")
    p.add_argument("--compare", nargs="+", default=None, metavar="URL_OR_MODEL",
                   help="two or more targets, models (routes) or, with --simulate, policies")  # fmt: skip
    p.add_argument("--rounds", type=_positive(int), default=3, help="interleaved rounds per level with --compare")
    p.add_argument("--simulate", type=_positive(int), default=None, metavar="N", help="N simulated backends")
    p.add_argument("--preset", default="seed", choices=PRESETS)
    p.add_argument("--policy", default="prefix_affinity", choices=POLICIES)
    p.add_argument("--engine-metrics", action="append", default=[], metavar="URL", help="an engine's /metrics")
    p.add_argument("--slo-ttft", type=_positive(float), default=2.0, help="p99 TTFT bound for the best-level pick")


def _problem(args: argparse.Namespace) -> str | None:
    if args.workload not in BUILTIN and not Path(args.workload).is_file():
        return f"--workload {args.workload!r}: not one of {', '.join(BUILTIN)} and not a file"
    if args.compare is not None and len(args.compare) < 2:
        return "--compare needs two or more targets, models or policies"
    if args.simulate and args.compare:
        bad = [c for c in args.compare if c not in POLICIES]
        if bad:
            return f"with --simulate, --compare takes policies ({', '.join(POLICIES)}), not {', '.join(bad)}"
    if args.warmup < 0:
        return "--warmup must be 0 or more"
    return None


async def _model(url: str, api_key: str | None) -> str:
    from gateway.bench.client import LoadClient

    async with LoadClient(url, api_key, 1) as client:
        names = await client.models()
    if not names:
        raise LookupError(f"{url}/v1/models lists no model; pass --model")
    return names[0]


async def _run(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    from gateway.bench.levels import Level, Plan, Runner, Target
    from gateway.bench.progress import LiveProgress
    from gateway.bench.simulate import simulated
    from gateway.bench.stats import best_under_slo, ratios
    from gateway.bench.workload import WorkloadSpec

    api_key = args.api_key or os.environ.get("OPENAI_API_KEY")
    levels = [Level(concurrency=c) for c in args.concurrency or ()] + [Level(rate=r) for r in args.rate or ()]
    if not levels:
        levels = [Level(concurrency=c) for c in (1, 4, 16, 32)]
    spec = WorkloadSpec(args.workload, args.prompt_tokens, args.output_tokens, args.seed, not args.no_ignore_eos)
    plan = Plan(levels, spec, args.requests, args.duration, args.warmup, args.rounds, api_key)
    async with contextlib.AsyncExitStack() as stack:
        targets: list[Target] = []
        if args.simulate:
            policies = args.compare or [args.policy]
            console.print(
                f"SIMULATED: {args.simulate} simulated vLLM-flavour backend(s), preset {args.preset!r} "
                f"(simulators, not real engines), behind the gateway with {' / '.join(policies)}"
            )
            for policy in policies:
                sim = await stack.enter_async_context(simulated(args.simulate, args.preset, policy))
                targets.append(Target(policy, sim.target, "tiny", [*sim.engine_metrics, *args.engine_metrics]))
        elif args.compare:
            for item in args.compare:
                if item.startswith(("http://", "https://")):
                    model = args.model or await _model(item, api_key)
                    targets.append(Target(item, item, model, args.engine_metrics))
                else:
                    targets.append(Target(item, args.target, item, args.engine_metrics, route=item))
        else:
            model = args.model or await _model(args.target, api_key)
            targets.append(Target("", args.target, model, args.engine_metrics))
        with LiveProgress(console) as live:
            results = await Runner(plan, targets).run(live.on_level, live.on_request)
    baseline = targets[0].name
    return {
        "levels": results,
        "slo": {t.name: best_under_slo([r for r in results if r["target"] == t.name], args.slo_ttft) for t in targets},
        "compare": {"baseline": baseline, "ratios": ratios(results, baseline)} if len(targets) > 1 else None,
        "run": {
            "command": "gateway bench " + shlex.join(sys.argv[2:]) if sys.argv[1:2] == ["bench"] else None,
            "targets": [{"name": t.name, "url": t.url, "model": t.model} for t in targets],
            "workload": {
                "kind": spec.kind,
                "prompt_tokens": spec.prompt_tokens,
                "output_tokens": spec.output_tokens,
                "ignore_eos": spec.ignore_eos,
                "seed": spec.seed,
            },
            "simulate": {"backends": args.simulate, "preset": args.preset} if args.simulate else None,
            "slo_ttft_s": args.slo_ttft,
        },
    }


NEEDS_EXTRA = "the load client is not installed: pip install 'llm-gateway[bench]'"


def run(args: argparse.Namespace) -> int:
    """The command (heavy imports here, so other subcommands start fast)."""
    try:
        import aiohttp
    except ImportError:  # the load client is an extra: `gateway serve` needs none of it
        print(f"gateway bench: {NEEDS_EXTRA}", file=sys.stderr)
        return 2
    from rich.console import Console

    from gateway.bench import chart, output, table
    from gateway.bench.workload import WorkloadError

    console = Console(width=None if sys.stdout.isatty() else 140, markup=False)  # URLs and names are not markup
    problem = _problem(args)
    if problem:
        print(f"gateway bench: {problem}", file=sys.stderr)
        return 2
    try:
        report = asyncio.run(_run(args, console))
    except (aiohttp.ClientError, LookupError, WorkloadError, OSError) as exc:
        print(f"gateway bench: {exc}", file=sys.stderr)
        return 1
    levels = report["levels"]
    console.print(table.render(levels))
    for name, slo in report["slo"].items():
        mine = [lv for lv in levels if lv["target"] == name]
        for line in table.notes(mine, slo, args.slo_ttft):
            console.print(f"{name + ': ' if len(report['slo']) > 1 else ''}{line}", highlight=False)
    if report["compare"]:
        for line in table.ratio_lines(report["compare"]["ratios"]):
            console.print(line, highlight=False)
    out = Path(args.out)
    written = output.write(out, report, levels)
    if chart.available():
        chart.plot(out / "bench.png", levels, _title(report))
        written.append(out / "bench.png")
    else:
        console.print(chart.NO_MATPLOTLIB)
    console.print("wrote " + ", ".join(str(p) for p in written), highlight=False)
    lost = sum(lv["stream_check"]["lost_events"] for lv in levels)
    if lost:
        console.print(
            f"{lost} stream(s) lost an event (no final event or usage, or more chunks than tokens)", style="red"
        )
    return 1 if lost else 0


def _title(report: dict[str, Any]) -> str:
    run = report["run"]
    names = ", ".join(t["name"] or f"{t['model']} at {t['url']}" for t in run["targets"])
    sim = run["simulate"]
    where = f"{sim['backends']} simulated backend(s), preset {sim['preset']}" if sim else names
    wl = run["workload"]
    return f"gateway bench: {wl['kind']} workload, {wl['output_tokens']} output tokens; {where}"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gateway bench")
    add_arguments(p)
    return run(p.parse_args(argv))
