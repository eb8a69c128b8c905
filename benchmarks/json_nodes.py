"""What the JSON node pre-scan (gateway.protocols.inbound.check_json_size) costs: on a normal chat body, on
1 MiB prompts (prose, and code-like text full of brackets inside strings), and on the 10 MiB
amplification body it refuses. Best of 5, in microseconds; json.loads beside it for scale.

    PYTHONPATH=$PWD python3 benchmarks/json_nodes.py
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable

from gateway.errors import InvalidRequest
from gateway.protocols.inbound import check_json_size


def best_us(fn: Callable[[], object], n: int) -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def scan(raw: bytes) -> None:
    with contextlib.suppress(InvalidRequest):
        check_json_size(raw, 1_000_000, 100_000)


def main() -> None:
    def chat(text: str) -> bytes:
        return json.dumps({"model": "m", "messages": [{"role": "user", "content": text}], "stream": True}).encode()

    bodies = [
        ("normal chat", chat("Tell me, please, about cats, dogs and [birds]. " * 40), 20_000, True),
        ("1 MiB prose", chat("hello world, this is text. " * 38_836), 20, True),
        ("1 MiB code-like", chat("a, b, [c], {d}, " * 65_536), 20, True),
        ("10 MiB, 3.4M {}", b'{"model":"m","x":[' + b",".join([b"{}"] * 3_400_000) + b"]}", 3, False),
    ]
    print(f"{'body':<18}{'bytes':>10}{'pre-scan us':>14}{'json.loads us':>15}")
    for name, raw, n, parse in bodies:
        loads = f"{best_us(lambda raw=raw: json.loads(raw), n):.1f}" if parse else "refused"  # type: ignore[misc]
        print(f"{name:<18}{len(raw):>10}{best_us(lambda raw=raw: scan(raw), n):>14.1f}{loads:>15}")  # type: ignore[misc]


if __name__ == "__main__":
    main()
