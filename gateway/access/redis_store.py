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

from gateway.access.budget import Holds, Limits
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


_HOLD = """
-- KEYS: held input now, before; held output now, before; then each budget's used input, output.
-- ARGV: each budget's input and output limit (-1: none); then the hold's input, output, and TTL.
local held_in = tonumber(redis.call('GET', KEYS[1]) or '0') + tonumber(redis.call('GET', KEYS[2]) or '0')
local held_out = tonumber(redis.call('GET', KEYS[3]) or '0') + tonumber(redis.call('GET', KEYS[4]) or '0')
local n = (#KEYS - 4) / 2
for i = 1, n do
  local used_in = tonumber(redis.call('GET', KEYS[3 + 2 * i]) or '0')
  local used_out = tonumber(redis.call('GET', KEYS[4 + 2 * i]) or '0')
  local lim_in, lim_out = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  if lim_in >= 0 and used_in + held_in >= lim_in then return {i, 0, used_in + held_in} end
  if lim_out >= 0 and used_out + held_out >= lim_out then return {i, 1, used_out + held_out} end
end
local ttl = ARGV[2 * n + 3]
redis.call('INCRBY', KEYS[1], ARGV[2 * n + 1])
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('INCRBY', KEYS[3], ARGV[2 * n + 2])
redis.call('EXPIRE', KEYS[3], ttl)
return {0, 0, 0}
"""

_SPEND = """
-- KEYS: held input, held output (the slot the hold went to); then each budget's used input, output.
-- ARGV: the hold's input and output; the spent input and output; each budget's TTL.
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('DECRBY', KEYS[1], ARGV[1]) end
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('DECRBY', KEYS[2], ARGV[2]) end
local out = {}
for i = 3, #KEYS, 2 do
  local ttl = ARGV[5 + (i - 3) / 2]
  out[#out + 1] = redis.call('INCRBY', KEYS[i], ARGV[3])
  redis.call('EXPIRE', KEYS[i], ttl)
  out[#out + 1] = redis.call('INCRBY', KEYS[i + 1], ARGV[4])
  redis.call('EXPIRE', KEYS[i + 1], ttl)
end
return out
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
        self._hold = self._redis.register_script(_HOLD)
        self._spend = self._redis.register_script(_SPEND)

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

    async def hold(
        self, holds: Holds, used: list[str], limits: list[Limits], amount: tuple[int, int], ttl_s: int
    ) -> tuple[int, int, int] | None:
        """Take a running request's hold unless a budget has nothing left (budget.exhausted's rule,
        in one script, so two replicas cannot both take the last tokens)."""
        args: list[int] = [-1 if v is None else v for pair in limits for v in pair]
        try:
            async with asyncio.timeout(self._timeout_s * 2):
                index, side, value = await self._hold(keys=[*holds, *used], args=[*args, *amount, ttl_s])
        except (RedisError, OSError, TimeoutError) as exc:
            raise StoreUnavailable(type(exc).__name__) from None
        return None if int(index) == 0 else (int(index) - 1, int(side), int(value))

    async def spend(
        self, holds: tuple[str, str], held: tuple[int, int], used: list[str], spent: tuple[int, int], ttls: list[int]
    ) -> list[tuple[int, int]]:
        """Release a request's hold and add what it used: each budget's (input, output) now."""
        try:
            async with asyncio.timeout(self._timeout_s * 2):
                values = await self._spend(keys=[*holds, *used], args=[*held, *spent, *ttls])
        except (RedisError, OSError, TimeoutError) as exc:
            raise StoreUnavailable(type(exc).__name__) from None
        return [(int(values[i]), int(values[i + 1])) for i in range(0, len(values), 2)]

    async def close(self) -> None:
        await self._redis.aclose()
