"""A benchmark run as one JSON file under benchmarks/results/: the date, the machine, the commit, the
command line and the run's figures, so two runs can be compared later (benchmarks/results/README.md
gives the format, benchmarks/results/compare.py the ratios)."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
FORMAT = 1


def _git(*args: str, tree: Path | None = None) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=tree or REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def _memory_gib() -> float | None:
    """MemTotal from /proc/meminfo (what `free` reports), in GiB."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _gpus() -> list[str]:
    """NVIDIA GPUs as `nvidia-smi -L` names them; none when it is not installed."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def _cpu_model() -> str | None:
    """The CPU's model name and whether it has AVX-512 (vLLM's CPU backend has kernels for it), from
    /proc/cpuinfo (Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in text.splitlines()[:40] if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    name = fields.get("model name")
    if name is None:
        return None
    return f"{name}, {'AVX-512' if 'avx512f' in fields.get('flags', '').split() else 'no AVX-512'}"


def machine() -> dict[str, Any]:
    """The machine a run is measured on: usable cores (`nproc`), CPU model, memory (`free`), GPUs,
    `uname -a`."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0
    memory, gpus, model = _memory_gib(), _gpus(), _cpu_model()
    mem = f"{memory:g} GiB" if memory is not None else "memory unknown"
    return {
        "description": f"{cpus} cores{f' ({model})' if model else ''}, {mem}, {', '.join(gpus) if gpus else 'no GPU'}",
        "cpus": cpus,
        "cpu_model": model,
        "memory_gib": memory,
        "gpus": gpus,
        "uname": " ".join(platform.uname()),
    }


def commit(tree: Path | None = None) -> str:
    """`git rev-parse HEAD` of this checkout (or of `tree`, a benchmark that measured another one),
    with "+dirty" when the gateway's or the benchmarks' sources have changes."""
    head = _git("rev-parse", "HEAD", tree=tree) or "unknown"
    dirty = _git("status", "--porcelain", "--", "gateway", "engines", "benchmarks", ":!benchmarks/results", tree=tree)
    return head + ("+dirty" if dirty else "")


def _finite(value: Any) -> Any:
    """JSON has no NaN: a figure that could not be measured is null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def write(
    benchmark: str,
    figures: Mapping[str, Any],
    *,
    argv: Sequence[str] | None = None,
    notes: str = "",
    extra: Mapping[str, Any] | None = None,
    directory: Path | None = None,
    tree: Path | None = None,
) -> Path:
    """Write one run's record and return its path: `<date>-<benchmark>-<commit>.json`, with a number
    added when that name is taken (two runs on one day). `extra` adds fields of the benchmark's own
    (its noise readings, say) beside the figures; `tree`: the checkout measured, when not this one."""
    now = datetime.now(UTC).replace(microsecond=0)
    head = commit(tree)
    record = {
        "format": FORMAT,
        "benchmark": benchmark,
        "date": now.isoformat(),
        "machine": machine(),
        "commit": head,
        "command": shlex.join(argv if argv is not None else sys.argv),
        "figures": _finite(figures),
        "notes": notes,
        **_finite(dict(extra or {})),
    }
    folder = directory if directory is not None else RESULTS
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{now.date().isoformat()}-{benchmark}-{head[:7]}"
    path, n = folder / f"{stem}.json", 1
    while path.exists():
        n += 1
        path = folder / f"{stem}-{n}.json"
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")
    return path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--results DIR and --no-record, the same in every benchmark that writes a record."""
    parser.add_argument(
        "--results", type=Path, default=RESULTS, help="write the run's record here (default benchmarks/results)"
    )
    parser.add_argument("--no-record", action="store_true", help="write no record of this run")


def write_if_asked(args: argparse.Namespace, benchmark: str, figures: Mapping[str, Any], **kwargs: Any) -> None:
    """The record, unless --no-record; its path goes to stderr, out of the way of the tables on stdout."""
    if args.no_record:
        return
    path = write(benchmark, figures, directory=args.results, **kwargs)
    print(f"record: {path}", file=sys.stderr)
