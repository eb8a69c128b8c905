"""The load client: asyncio over aiohttp, with its own connection pool sized to the concurrency.
Streams every request with usage, and times the first token, each gap and the end, client side."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import Any

import aiohttp

from gateway.bench.stats import Timing

Progress = Callable[[Timing], None]
TIMEOUT = aiohttp.ClientTimeout(total=None, connect=10, sock_read=120)


def _has_content(choice: Any) -> bool:
    delta = choice.get("delta") if isinstance(choice, dict) else None
    if not isinstance(delta, dict):
        return False
    return any(delta.get(k) for k in ("content", "reasoning_content", "tool_calls"))


def observe(timing: Timing, payload: bytes, now: float) -> None:
    """Account for one SSE ``data:`` payload of a chat completions stream."""
    if payload == b"[DONE]":
        timing.done = True
        return
    try:
        event = json.loads(payload)
    except ValueError:
        timing.error = "bad_event"
        return
    if not isinstance(event, dict):
        timing.error = "bad_event"
        return
    if "error" in event and not event.get("choices"):
        timing.error = "midstream_error"
        return
    usage = event.get("usage")
    if isinstance(usage, dict):
        timing.completion_tokens = usage.get("completion_tokens")
        timing.prompt_tokens = usage.get("prompt_tokens")
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            timing.cached_tokens = details["cached_tokens"]
    for choice in event.get("choices") or ():
        if _has_content(choice):
            if timing.first_token is None:
                timing.first_token = now
            elif timing.last_token is not None:
                timing.gaps.append(now - timing.last_token)
            timing.last_token = now
            timing.content_events += 1
        if isinstance(choice, dict) and choice.get("finish_reason"):
            timing.finished = True


class LoadClient:
    """One aiohttp session per run; ``limit`` connections, no cookies, the key as a bearer token."""

    def __init__(self, target: str, api_key: str | None, limit: int) -> None:
        self.url = target.rstrip("/") + (
            "/chat/completions" if target.rstrip("/").endswith("/v1") else "/v1/chat/completions"
        )
        self.base = self.url.removesuffix("/v1/chat/completions")
        self.headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.limit = limit  # 0: no limit (open loop, where sends must never wait for a connection)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> LoadClient:
        connector = aiohttp.TCPConnector(limit=self.limit, limit_per_host=self.limit)
        self._session = aiohttp.ClientSession(
            connector=connector, cookie_jar=aiohttp.DummyCookieJar(), timeout=TIMEOUT, headers=self.headers
        )
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "use LoadClient as an async context manager"
        return self._session

    async def models(self) -> list[str]:
        async with self.session.get(self.base + "/v1/models") as resp:
            data = await resp.json(content_type=None)
        return [m["id"] for m in data.get("data", []) if isinstance(m, dict) and "id" in m]

    async def connect(self, n: int) -> None:
        """Open ``n`` connections before a level (n overlapping GET /v1/models), so that no measured
        request pays for a TCP handshake."""

        async def get() -> None:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with self.session.get(self.base + "/v1/models") as resp:
                    await resp.read()

        await asyncio.gather(*(get() for _ in range(n)))

    async def one(self, body: dict[str, Any]) -> Timing:
        """Send one streamed request and time it; a failure becomes ``Timing.error``, never an exception."""
        timing = Timing(start=time.perf_counter(), end=0.0)
        try:
            async with self.session.post(self.url, json=body) as resp:
                if resp.status != 200:
                    await resp.read()
                    timing.error = f"http_{resp.status}"
                else:
                    buf = b""
                    async for chunk in resp.content.iter_any():
                        now = time.perf_counter()
                        buf += chunk
                        *lines, buf = buf.split(b"\n")
                        for line in lines:
                            if line.startswith(b"data:"):
                                observe(timing, line[5:].strip(), now)
                    if timing.error is None and not timing.done:
                        timing.error = "stream_cut"
        except (aiohttp.ClientError, TimeoutError) as exc:
            timing.error = type(exc).__name__
        timing.end = time.perf_counter()
        return timing

    async def closed_loop(
        self, bodies: Iterator[dict[str, Any]], concurrency: int, count: int | None, duration: float | None,
        progress: Progress,
    ) -> list[Timing]:  # fmt: skip
        """``concurrency`` users, each sending its next request when the last one ends; stops after
        ``count`` requests, or at ``duration`` seconds (requests in flight then are finished)."""
        results: list[Timing] = []
        issued = 0
        deadline = None if duration is None else time.perf_counter() + duration

        async def user() -> None:
            nonlocal issued
            while (count is None or issued < count) and (deadline is None or time.perf_counter() < deadline):
                issued += 1
                timing = await self.one(next(bodies))
                results.append(timing)
                progress(timing)

        await asyncio.gather(*(user() for _ in range(concurrency)))
        return results

    async def open_loop(
        self, bodies: Iterator[dict[str, Any]], arrivals: Sequence[float], duration: float | None, progress: Progress
    ) -> list[Timing]:
        """Send at the given times (seconds from now), whatever is still in flight: a slow answer
        never delays the next send."""
        results: list[Timing] = []
        tasks: list[asyncio.Task[None]] = []
        start = time.perf_counter()

        async def send(body: dict[str, Any]) -> None:
            timing = await self.one(body)
            results.append(timing)
            progress(timing)

        for at in arrivals:
            if duration is not None and at > duration:
                break
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(next(bodies))))
        await asyncio.gather(*tasks)
        return results
