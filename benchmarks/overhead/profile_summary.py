"""Summarise py-spy raw (collapsed) profiles of the gateway: where its CPU goes, by layer and by
function. py-spy without --idle samples only a thread that is running, so a share of samples is a
share of the gateway's CPU time.

    python profile_summary.py /tmp/prof/nonstream.txt /tmp/prof/realistic.txt [--top 25]

For each file: (a) self time by layer (the innermost frame's package: uvicorn, starlette, gateway,
aiohttp, prometheus_client, json, logging, asyncio, the uvloop loop itself...), (b) inclusive time of
the gateway's own functions, (c) the top self-time functions. Native code (uvloop, httptools, the
json C scanner) has no Python frame, so it counts towards the Python function that called it; time
in uvloop's loop between callbacks (epoll, socket I/O, scheduling) lands on asyncio.run, shown as
"event loop (uvloop, native)". Samples blocked in the pure-Python loop's epoll_wait are left out:
py-spy often reads that thread as running, but it is waiting."""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>.*?)(?::\d+)?\)$")

# Layers named after the innermost frame's package (py-spy prints paths relative to sys.path).
_PACKAGES = {
    "uvicorn": "uvicorn (HTTP server, httptools protocol)",
    "starlette": "starlette (app, middleware, routing)",
    "aiohttp": "aiohttp (upstream client)",
    "yarl": "yarl / multidict (URLs, headers)",
    "multidict": "yarl / multidict (URLs, headers)",
    "prometheus_client": "prometheus_client",
    "json": "json",
    "logging": "logging",
    "selectors.py": "event loop (pure-Python asyncio: selectors, transports)",
}
_LOOP_FILES = ("asyncio/base_events.py", "asyncio/selector_events.py", "asyncio/events.py")


def parse_frame(frame: str) -> tuple[str, str]:
    m = _FRAME.match(frame.strip())
    if m is None:
        return frame.strip(), ""
    return m.group("func"), m.group("file")


def layer_of(func: str, path: str) -> str:
    if path.endswith("asyncio/runners.py") or path.endswith("gateway/cli.py"):
        return "event loop (uvloop, native: epoll, socket I/O, callbacks)"
    if path.endswith(_LOOP_FILES):
        return "event loop (pure-Python asyncio: selectors, transports)"
    top = path.split("/", 1)[0]
    if top in ("gateway", "engines"):
        return path
    if top == "asyncio":
        return "asyncio (tasks, futures, timeouts, locks)"
    if top in _PACKAGES:
        return _PACKAGES[top]
    return f"other: {path}" if path else "other"


def _package_layer(path: str) -> str | None:
    """The library a frame belongs to, for the inclusive-by-library table."""
    top = path.split("/", 1)[0]
    if top in ("aiohttp", "prometheus_client", "json", "logging", "yarl", "multidict"):  # not the wrappers
        return top
    if path.startswith("asyncio/timeouts.py"):
        return "asyncio.timeout"
    return None


def short(func: str, path: str) -> str:
    return f"{path}:{func}"


def summarise(path: Path, top: int) -> str:
    self_layer: Counter[str] = Counter()
    self_func: Counter[str] = Counter()
    incl_gateway: Counter[str] = Counter()
    incl_any: Counter[str] = Counter()
    incl_layer: Counter[str] = Counter()
    total = idle = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [parse_frame(f) for f in stack.split(";")]
        func, file = frames[-1]
        if file == "selectors.py" and func.endswith(".select"):
            idle += n  # blocked in epoll_wait: py-spy often takes this for running; it is waiting
            continue
        total += n
        self_layer[layer_of(func, file)] += n
        self_func[short(func, file)] += n
        for layer in {_package_layer(file) for _, file in frames}:
            if layer is not None:
                incl_layer[layer] += n
        seen: set[str] = set()
        for func, file in frames:
            key = short(func, file)
            if key in seen:
                continue
            seen.add(key)
            incl_any[key] += n
            if file.startswith(("gateway/", "engines/")):
                incl_gateway[key] += n
    if total == 0:
        return f"## {path.stem}\n\n(no samples)\n"
    note = (
        f" (and {idle:,} more in epoll_wait, {idle / (idle + total):.0%}, left out: waiting, not work)" if idle else ""
    )
    out = [f"## {path.stem}: {total:,} samples{note}", "", "Self time by layer:", "", "| layer | share |", "|---|---:|"]
    out += [f"| {k} | {v / total:.1%} |" for k, v in self_layer.most_common()]
    out += [
        "",
        "Inclusive time by library (samples with any frame in it; callees included, so these overlap):",
        "",
        "| library | share |",
        "|---|---:|",
    ]
    out += [f"| {k} | {v / total:.1%} |" for k, v in incl_layer.most_common()]
    out += ["", "Inclusive time of gateway functions (callees included):", "", "| function | share |", "|---|---:|"]
    out += [f"| {k} | {v / total:.1%} |" for k, v in incl_gateway.most_common(top)]
    out += ["", "Inclusive time, any function (top):", "", "| function | share |", "|---|---:|"]
    out += [f"| {k} | {v / total:.1%} |" for k, v in incl_any.most_common(top) if v / total < 0.999]
    out += ["", f"Top {top} self-time functions:", "", "| function | share |", "|---|---:|"]
    out += [f"| {k} | {v / total:.1%} |" for k, v in self_func.most_common(top)]
    return "\n".join(out) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args()
    for f in a.files:
        sys.stdout.write(summarise(f, a.top) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
