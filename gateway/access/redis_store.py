"""Limit counters in Redis, shared by every gateway replica that points at it: one atomic Lua
script per request (INCR the request counter, EXPIRE it with the window, read the token counter),
one per finished request (INCRBY the tokens). Every failure is raised as StoreUnavailable; the
gate decides what it means (limits.fail_open)."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from gateway.access.limiter import StoreUnavailable

_HIT = """
local seen = 0
if ARGV[1] == '1' then
  seen = redis.call('INCR', KEYS[1])
  if seen == 1 then redis.call('EXPIRE', KEYS[1], ARGV[2]) end
end
local tokens = tonumber(redis.call('GET', KEYS[2]) or '0')
return {seen, tokens}
"""

_ADD = """
local value = redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return value
"""


class RedisStore:
    def __init__(self, url: str, timeout_s: float) -> None:
        # No retries inside the client: a Redis that is down must cost one refused connect, and
        # the gate's own back-off decides when to try again.
        self._redis = Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 0)
        )
        self._timeout_s = timeout_s
        self._hit = self._redis.register_script(_HIT)
        self._add = self._redis.register_script(_ADD)

    async def hit(self, requests: str, tokens: str, count_request: bool, ttl_s: int) -> tuple[int, int]:
        try:
            async with asyncio.timeout(self._timeout_s * 2):
                seen, used = await self._hit(keys=[requests, tokens], args=["1" if count_request else "0", ttl_s])
        except (RedisError, OSError, TimeoutError) as exc:
            raise StoreUnavailable(type(exc).__name__) from None
        return int(seen), int(used)

    async def add(self, tokens: str, amount: int, ttl_s: int) -> None:
        try:
            async with asyncio.timeout(self._timeout_s * 2):
                await self._add(keys=[tokens], args=[amount, ttl_s])
        except (RedisError, OSError, TimeoutError) as exc:
            raise StoreUnavailable(type(exc).__name__) from None

    async def close(self) -> None:
        await self._redis.aclose()
