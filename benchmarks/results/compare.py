"""Two benchmark records side by side: every figure both hold, A's value, B's and the ratio B / A.

    python3 benchmarks/results/compare.py A.json B.json [--only PREFIX]

Figures are named by their path in the record's `figures`, joined by "/" (for the overhead benchmark:
peer / figure / statistic, e.g. `gateway+mypyc/nonstream.cpu_us_per_req/ratio`). Whether a ratio above 1
is better depends on the figure: req/s up is better, CPU, latency and memory down.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def flatten(value: Any, path: str = "") -> Iterator[tuple[str, float]]:
    """Every number under `value`, with its path; booleans, strings and nulls are not figures."""
    if isinstance(value, dict):
        for key, sub in value.items():
            yield from flatten(sub, f"{path}/{key}" if path else str(key))
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield path, float(value)


def load(path: Path) -> dict[str, Any]:
    record = json.loads(path.read_text())
    if not isinstance(record, dict) or not isinstance(record.get("figures"), dict):
        raise SystemExit(f"{path}: not a benchmark record (no `figures` object)")
    return record


def describe(name: str, record: dict[str, Any]) -> str:
    machine = record.get("machine") or {}
    where = machine.get("description", "machine unknown") if isinstance(machine, dict) else str(machine)
    return f"{name}: {record.get('benchmark', '?')} {record.get('date', '?')} {record.get('commit', '?')}, {where}"


def rows(a: dict[str, Any], b: dict[str, Any], only: str = "") -> list[tuple[str, float, float, float | None]]:
    """(figure, A, B, B / A) for each figure both records hold, in A's order; no ratio over a zero."""
    theirs = dict(flatten(b["figures"]))
    out = []
    for name, mine in flatten(a["figures"]):
        if name.startswith(only) and name in theirs:
            other = theirs[name]
            out.append((name, mine, other, other / mine if mine else None))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a", type=Path, help="the baseline record")
    p.add_argument("b", type=Path, help="the record compared with it")
    p.add_argument("--only", default="", help="only the figures whose path starts with this")
    args = p.parse_args(argv)
    a, b = load(args.a), load(args.b)
    print(describe("A", a))
    print(describe("B", b))
    table = rows(a, b, args.only)
    if not table:
        print("no figure in common")
        return 1
    width = max(len(name) for name, *_ in table)
    print(f"{'figure':{width}}  {'A':>12}  {'B':>12}  {'B / A':>7}")
    for name, x, y, ratio in table:
        shown = f"{ratio:.2f}x" if ratio is not None else "n/a"
        print(f"{name:{width}}  {x:12,.3f}  {y:12,.3f}  {shown:>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
