"""Limit counters in this process: the store when no Redis is configured, so limits hold per
replica only. Bounded: counters of past windows are dropped."""

from __future__ import annotations

import time

from gateway.access.budget import Holds, Limits, exhausted


class MemoryStore:
    """Counter name -> (value, expiry on the monotonic clock)."""

    def __init__(self) -> None:
        self._counts: dict[str, tuple[int, float]] = {}

    async def hit(self, requests: str, tokens: str, count_request: bool, ttl_s: int) -> tuple[int, int]:
        """Add one to `requests` (when counted) and read `tokens`: (requests now, tokens now)."""
        now = time.monotonic()
        self._prune(now)
        seen = self._add(requests, 1, ttl_s, now) if count_request else 0
        return seen, self._get(tokens, now)

    async def add(self, tokens: str, amount: int, ttl_s: int) -> None:
        self._add(tokens, amount, ttl_s, time.monotonic())

    async def hold(
        self, holds: Holds, used: list[str], limits: list[Limits], amount: tuple[int, int], ttl_s: int
    ) -> tuple[int, int, int] | None:
        now = time.monotonic()
        self._prune(now)
        get = self._get
        held = (get(holds[0], now) + get(holds[1], now), get(holds[2], now) + get(holds[3], now))
        spent = [(self._get(used[i], now), self._get(used[i + 1], now)) for i in range(0, len(used), 2)]
        found = exhausted(limits, spent, held)
        if found is None:
            self._add(holds[0], amount[0], ttl_s, now)
            self._add(holds[2], amount[1], ttl_s, now)
        return found

    async def spend(
        self, holds: tuple[str, str], held: tuple[int, int], used: list[str], spent: tuple[int, int], ttls: list[int]
    ) -> list[tuple[int, int]]:
        now = time.monotonic()
        for name, amount in zip(holds, held, strict=True):
            if self._get(name, now) > 0:
                self._add(name, -amount, 0, now)
        out = []
        for i in range(0, len(used), 2):
            ttl = ttls[i // 2]
            out.append((self._add(used[i], spent[0], ttl, now), self._add(used[i + 1], spent[1], ttl, now)))
        return out

    async def close(self) -> None:
        return None

    def _get(self, name: str, now: float) -> int:
        value, expires = self._counts.get(name, (0, now))
        return value if expires > now else 0

    def _add(self, name: str, amount: int, ttl_s: int, now: float) -> int:
        value = self._get(name, now) + amount
        expires = self._counts[name][1] if name in self._counts and self._counts[name][1] > now else now + ttl_s
        self._counts[name] = (value, expires)
        return value

    def _prune(self, now: float) -> None:
        if len(self._counts) > 256:
            self._counts = {k: v for k, v in self._counts.items() if v[1] > now}
