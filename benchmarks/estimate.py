"""Microbenchmark: the cap check's token estimate on the hot path, for a 32k-token chat prompt.

    python benchmarks/estimate.py

The bar is <= 20 us per estimate for a 32k-token prompt. The estimate counts characters
per message (len() of each string, O(messages)) and divides by a learned ratio; it never walks the
text, so its cost depends on the number of messages, not on their length."""

from __future__ import annotations

import timeit

from gateway.policy.caps import TokenEstimator, prompt_size


def body(messages: int, tokens: int) -> dict[str, object]:
    per = tokens * 4 // messages  # ~4 characters per token
    msgs = [{"role": "system", "content": "s" * per}]
    msgs += [{"role": "user" if i % 2 else "assistant", "content": "w" * per} for i in range(messages - 1)]
    return {"model": "m", "messages": msgs}


def main() -> None:
    est = TokenEstimator()
    key = ("route", "model")
    est.learn(key, 4000, 2, 1010)
    print("| prompt | messages | µs per estimate (prompt_size + estimate) |")
    print("|---|---|---|")
    for messages in (2, 16, 64, 256):
        b = body(messages, 32_768)

        def run(b: dict[str, object] = b) -> int:
            chars, n, known = prompt_size(b)
            return est.estimate(key, chars, n, known)

        loops = 20_000
        best = min(timeit.repeat(run, number=loops, repeat=5)) / loops
        print(f"| 32k tokens | {messages} | {best * 1e6:.2f} |")


if __name__ == "__main__":
    main()
