"""Limit counters in this process: the store when no Redis is configured, so limits hold per
replica only. Bounded: counters of past windows are dropped."""

from __future__ import annotations

import time


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
