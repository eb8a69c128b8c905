"""Send a request upstream, retry only before the first byte reaches the client, relay the raw
bytes, and leave the outcome on the Exchange for the finish step."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

import aiohttp

from gateway.errors import (
    EngineError,
    GatewayError,
    NoHealthyBackend,
    ShuttingDown,
    UpstreamError,
    UpstreamTimeout,
    parse_retry_after,
)
from gateway.exchange import Exchange
from gateway.lifecycle import Lifecycle
from gateway.metrics import GatewayMetrics
from gateway.registry import Backend, Registry
from gateway.sse import StreamObserver
from gateway.upstream import UpstreamClient, UpstreamConnectError, error_kind, translate

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
_PING = b": ping\n\n"
_COUNT_EVERY = 16
"""Stream tokens are added to the output counter in steps of this many chunks, not one by one."""
_MAX_ERROR_BODY = 64 * 1024


class _IdleWatch:
    """Cancels the relaying task once no chunk has moved for `idle_s`. One timer that re-arms
    itself from the last chunk's time: rescheduling a timeout on every chunk cost ~4 us a token."""

    __slots__ = ("_handle", "_idle_s", "_loop", "_task", "fired", "last")

    def __init__(self, idle_s: float, last: float) -> None:
        self._loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._idle_s = idle_s
        self.last = last  # inf until the first chunk: the first-token wait has its own limit
        self.fired = False
        self._handle = self._loop.call_later(idle_s, self._check)

    def _check(self) -> None:
        due = self.last + self._idle_s
        if self._loop.time() >= due:
            self.fired = True
            self._task.cancel()
        else:
            self._handle = self._loop.call_at(min(due, self._loop.time() + self._idle_s), self._check)

    def close(self) -> None:
        self._handle.cancel()


class StreamCut(Exception):
    """The upstream stream ended without its final event; carries the outcome to record."""

    def __init__(self, outcome: str, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.message = message


class Proxy:
    def __init__(
        self,
        registry: Registry,
        upstream: UpstreamClient,
        metrics: GatewayMetrics,
        max_attempts: int,
        idle_s: float,
        keepalive_s: float,
        first_byte_s: float,
        lifecycle: Lifecycle | None = None,
    ) -> None:
        self._registry = registry
        self._lifecycle = lifecycle or Lifecycle()
        self._upstream = upstream
        self._metrics = metrics
        self._max_attempts = max_attempts
        self._idle_s = idle_s
        self._keepalive_s = keepalive_s
        # The first token may take as long as the first byte may: engines that stream send their
        # headers at once, so a long prefill shows up as a wait for the first chunk.
        self._first_token_s = first_byte_s

    async def forward(
        self, ex: Exchange, send: Send, body: bytes, headers: dict[str, str], order: Sequence[Backend]
    ) -> None:
        """Try backends in order until one answers 200, then relay. Raises GatewayError when
        nothing could be relayed; the caller renders it."""
        last_error: GatewayError | None = None
        attempts = 0
        for backend in order:
            if attempts >= self._max_attempts:
                break
            took_retry = False
            if attempts > 0:
                if not self._registry.try_take_retry():
                    self._metrics.retry_budget_exhausted.labels(ex.route).inc()
                    break
                took_retry = True
                self._metrics.retries.labels(ex.route, ex.pool).inc()
            attempts += 1
            ex.set_backend(backend)
            self._registry.acquire(backend)
            ex.in_flight_gauge().inc()
            try:
                try:
                    if attempts == 1:
                        ex.mark_sent()
                    resp = await self._upstream.post(
                        backend.url + ex.path,
                        ex.upstream_body(body, backend),
                        headers_for(headers, backend),
                        backend.name,
                    )
                except (UpstreamError, UpstreamTimeout) as exc:
                    last_error = exc
                    self._count_failure(backend, error_kind(exc))
                    continue
                if resp.status != 200:
                    error = await self._error_from(resp, backend)
                    if resp.status >= 500 or resp.status == 429:
                        last_error = error
                        self._count_failure(
                            backend, "status_429" if resp.status == 429 else "status_5xx", penalise=resp.status >= 500
                        )
                        continue
                    raise error
                self._registry.record_success(backend)
                if ex.inbound is not None and ex.inbound.stream:
                    await self._relay_stream(ex, send, resp)
                else:
                    await self._relay_body(ex, send, resp)
                return
            finally:
                ex.in_flight_gauge().dec()
                self._registry.release(backend)
                if took_retry:
                    self._registry.give_back_retry()
        raise last_error or NoHealthyBackend("No healthy backend is available.", retry_after=5)

    def _count_failure(self, backend: Backend, kind: str, penalise: bool = True) -> None:
        self._metrics.upstream_errors.labels(backend.pool, backend.name, kind).inc()
        if penalise and self._registry.record_failure(backend):
            self._metrics.backend_up.labels(backend.pool, backend.name, backend.engine).set(0)

    async def _error_from(self, resp: aiohttp.ClientResponse, backend: Backend) -> GatewayError:
        try:
            raw = await resp.content.read(_MAX_ERROR_BODY)
        except (aiohttp.ClientError, OSError):
            raw = b""
        finally:
            resp.close()
        norm = backend.adapter.normalise_error(resp.status, raw)
        retry_after = _retry_after(resp.headers.get("retry-after"))
        if retry_after is None and resp.status in (429, 503):
            retry_after = 1  # absent, or absurd (inf, 1e999): the client still gets a sane one
        if resp.status == 503:
            # Overloaded or not ready: keep the status so the client backs off as the engine asked.
            return NoHealthyBackend(
                f"Backend {backend.name} is unavailable (503).",
                code="upstream_unavailable",
                retry_after=retry_after,
            )
        return EngineError(
            norm.message, status=norm.status, type_=norm.type, code=norm.code, param=norm.param, retry_after=retry_after
        )

    async def _relay_body(self, ex: Exchange, send: Send, resp: aiohttp.ClientResponse) -> None:
        try:
            async with asyncio.timeout(max(self._idle_s, self._first_token_s)):
                raw = await resp.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            resp.close()
            raise translate(exc, ex.backend_name) from None
        resp.release()
        try:
            parsed = json.loads(raw)
        except ValueError:
            raise UpstreamError(
                f"Backend {ex.backend_name} sent a response that is not JSON.", code="bad_upstream_response"
            ) from None
        if isinstance(parsed, dict) and isinstance(parsed.get("usage"), dict):
            ex.usage = parsed["usage"]
            if ex.engine_truncated(ex.usage):
                self._metrics.cap_actions.labels(ex.route, "engine_truncated", "usage").inc()
                expected = ex.prompt_exact or ex.prompt_estimate
                ex.extra_headers.append(
                    (b"x-gateway-engine-truncated-prompt", f"{ex.usage.get('prompt_tokens')}/{expected}".encode())
                )
        ex.status = 200
        ctype = resp.headers.get("content-type", "application/json").encode("latin-1")
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", ctype),
                    (b"content-length", str(len(raw)).encode()),
                    *ex.response_headers(),
                ],
            }
        )
        ex.response_started = True
        await send({"type": "http.response.body", "body": raw, "more_body": False})
        ex.outcome = "success"

    async def _relay_stream(self, ex: Exchange, send: Send, resp: aiohttp.ClientResponse) -> None:
        observer = StreamObserver(strip_usage=ex.injected_usage)
        ex.observer = observer
        loop = asyncio.get_running_loop()
        clock = time.perf_counter
        content = resp.content
        relay_s = 0.0
        chunks = 0
        watch = _IdleWatch(self._idle_s, float("inf"))
        try:
            first = await self._first_chunk(ex, send, content)
            t0 = clock()
            out = observer.feed(first, t0) if first else b""
            if observer.error is not None and not ex.response_started:
                assert ex.backend is not None
                raise _first_event_error(observer.error, ex.backend)
            if not ex.response_started:
                await self._start_stream(ex, send)
            if out:
                await send({"type": "http.response.body", "body": out, "more_body": True})
            relay_s += clock() - t0
            chunks += 1
            watch.last = loop.time()
            while first:
                chunk = await content.readany()
                if not chunk:
                    break
                t0 = clock()
                watch.last = loop.time()
                out = observer.feed(chunk, t0)
                if observer.content_events - ex.streamed_tokens >= _COUNT_EVERY:
                    ex.count_streamed(observer.content_events)
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
                relay_s += clock() - t0
                chunks += 1
            rest = observer.flush()
            if not observer.done:
                raise StreamCut(
                    "upstream_error_midstream", f"Backend {ex.backend_name} ended the stream before it was complete."
                )
            await send({"type": "http.response.body", "body": rest, "more_body": False})
            ex.outcome = "success"
            resp.release()
        except asyncio.CancelledError:
            resp.close()
            if not watch.fired:
                raise  # the client left: closing, not releasing, the connection stops the engine
            task = asyncio.current_task()
            assert task is not None
            task.uncancel()
            await self._cut(ex, send, StreamCut("timeout_idle", f"Backend {ex.backend_name} stalled mid-stream."))
        except StreamCut as cut:
            resp.close()
            await self._cut(ex, send, cut)
        except (aiohttp.ClientError, OSError) as exc:
            resp.close()
            await self._cut(ex, send, StreamCut("upstream_error_midstream", translate(exc, ex.backend_name).message))
        except BaseException:
            resp.close()
            raise
        finally:
            watch.close()
            self._metrics.child(self._metrics.relay_seconds, ex.route).inc(relay_s)
            self._metrics.child(self._metrics.relay_chunks, ex.route).inc(chunks)

    async def _first_chunk(self, ex: Exchange, send: Send, content: aiohttp.StreamReader) -> bytes:
        """Wait for the first chunk, holding back the client's headers so that an error there can
        still become a proper HTTP error; past keepalive_s, start the stream and ping instead."""
        limit = self._first_token_s
        try:
            if self._keepalive_s <= 0:
                async with asyncio.timeout(limit):
                    return await content.readany()
            read = asyncio.ensure_future(content.readany())
            deadline = asyncio.get_running_loop().time() + limit
            try:
                while True:
                    left = deadline - asyncio.get_running_loop().time()
                    if left <= 0:
                        raise TimeoutError
                    done, _ = await asyncio.wait((read,), timeout=min(self._keepalive_s, left))
                    if done:
                        return read.result()
                    if not ex.response_started:
                        await self._start_stream(ex, send)
                    await send({"type": "http.response.body", "body": _PING, "more_body": True})
            finally:
                if not read.done():
                    read.cancel()
        except TimeoutError:
            raise StreamCut("timeout_ttfb", f"Backend {ex.backend_name} sent no first token in time.") from None

    async def _start_stream(self, ex: Exchange, send: Send) -> None:
        ex.status = 200
        await send({"type": "http.response.start", "status": 200, "headers": [*_SSE_HEADERS, *ex.response_headers()]})
        ex.response_started = True

    async def _cut(self, ex: Exchange, send: Send, cut: StreamCut) -> None:
        """A stream that broke after the client got its headers: one error event, and no
        [DONE], so the client can tell a cut-off answer from a finished one. While the gateway
        drains, a backend that goes away is taken to go with it (one Ctrl-C stops both): the
        event says the gateway is shutting down, and nothing is counted against the backend."""
        if self._lifecycle.draining and cut.outcome == "upstream_error_midstream":
            ex.outcome = "overloaded"
            if not ex.response_started:
                raise ShuttingDown()
            event = ShuttingDown().body()
        else:
            ex.outcome = cut.outcome
            kind = cut.outcome if cut.outcome in ("timeout_idle", "timeout_ttfb") else "midstream"
            if ex.backend is not None:
                self._metrics.upstream_errors.labels(ex.pool, ex.backend_name, kind).inc()
            if not ex.response_started:
                if cut.outcome == "timeout_ttfb":
                    raise UpstreamTimeout(cut.message)
                raise UpstreamError(cut.message, code="upstream_disconnected")
            event = {"error": {"message": cut.message, "type": "upstream_error", "param": None, "code": cut.outcome}}
        # A client that stopped reading (the reason the stream stalled, perhaps) must not hold this
        # task forever: give the last event a few seconds, then let uvicorn close the connection.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):
                await send(
                    {
                        "type": "http.response.body",
                        "body": b"data: " + json.dumps(event).encode() + b"\n\n",
                        "more_body": False,
                    }
                )


def headers_for(base: dict[str, str], backend: Backend) -> dict[str, str]:
    if backend.api_key is None:
        return base
    return {**base, **backend.auth_headers()}


def _retry_after(value: str | None) -> float | None:
    return parse_retry_after(value, time.time())


def _first_event_error(error: dict[str, Any], backend: Backend) -> GatewayError:
    """A 200 stream whose first event is an error becomes a proper HTTP error, normalised by the
    engine's adapter like any other error body (so a context error is still 400)."""
    inner = error.get("error", error)
    code = inner.get("code") if isinstance(inner, dict) else None
    status = code if isinstance(code, int) and 400 <= code < 600 else 502
    norm = backend.adapter.normalise_error(status, json.dumps(error).encode())
    if norm.status >= 500:
        return UpstreamError(norm.message, code="upstream_error_event")
    return EngineError(norm.message, status=norm.status, type_=norm.type, code=norm.code, param=norm.param)


__all__ = ["Proxy", "StreamCut", "UpstreamConnectError"]
