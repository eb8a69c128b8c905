"""Relay one upstream answer to the client: a body whole, or a stream chunk by chunk with the
client's headers held until the first chunk, keep-alive pings while it waits, an idle watch, and
one error event (no [DONE]) when the stream is cut."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Final

from gateway.asgi import BODY_WRITER, ChunkWriter, Send
from gateway.errors import EngineError, GatewayError, ShuttingDown, UpstreamError, UpstreamTimeout
from gateway.fleet.health import PassiveHealth
from gateway.fleet.registry import Backend
from gateway.metrics import GatewayMetrics
from gateway.pipeline.accounting import Accounting, prompt_tokens
from gateway.pipeline.context import Dispatch, IdleEnd
from gateway.pipeline.exchange import Exchange, Outcome
from gateway.pipeline.headers import SSE, response_headers
from gateway.pipeline.lifecycle import Lifecycle
from gateway.policy.caps import engine_truncated
from gateway.protocols.base import ProtocolAdapter, SseObserver, StreamTransform, Target
from gateway.protocols.events import DEFAULT_MAX_EVENT_BYTES, EventTooLarge
from gateway.protocols.rename import ModelRename
from gateway.upstream.client import UpstreamResponse

_PING: Final = b": ping\n\n"
_COUNT_EVERY: Final = 16
"""Stream tokens are added to the output counter in steps of this many chunks, not one by one."""


class IdleWatch:
    """Ends the request (through its owner's `end`) once no chunk has moved for `idle_s`. One timer
    that re-arms itself from the last chunk's time (`last`, in `time.perf_counter()`'s seconds: the
    clock the relay already read for the chunk): rescheduling a timeout on every chunk cost ~4 us a
    token. It cancels nothing itself. When it fires it notes whether the backend had sent bytes
    still unread (the client stopped reading: not the backend's fault)."""

    __slots__ = ("_end", "_ex", "_handle", "_idle_s", "_loop", "_resp", "last")

    def __init__(
        self, idle_s: float, end: IdleEnd, ex: Exchange, resp: UpstreamResponse, loop: asyncio.AbstractEventLoop
    ) -> None:
        self._loop = loop
        self._end = end
        self._ex = ex
        self._resp = resp
        self._idle_s = idle_s
        self.last = float("inf")  # until the first chunk: the first-token wait has its own limit
        self._handle = self._loop.call_later(idle_s, self._check)

    def _check(self) -> None:
        left = self.last + self._idle_s - time.perf_counter()
        if left <= 0:
            self._ex.client_stalled = self._resp.unread()
            self._end.end("idle_limit")
        else:
            self._handle = self._loop.call_later(min(left, self._idle_s), self._check)

    def close(self) -> None:
        self._handle.cancel()


class Splice:
    """The middle of a stream relayed from the upstream connection's parser callback: each chunk
    observed, transformed and written to the client through the server's `ChunkWriter` at once,
    with no future, no task wake and no coroutine a chunk (the relay's loop cost about as much
    again as the work itself; docs/benchmarks.md). It steps back (returns False) when the writer
    cannot take a chunk now (the client's socket is full, or it is gone): the relay's task then
    sends what it holds (`pending`) through `send`, which waits for the drain, and splices again."""

    __slots__ = (
        "_accounting",
        "_ex",
        "_observer",
        "_transform",
        "_watch",
        "chunks",
        "error",
        "pending",
        "relay_s",
        "writer",
    )

    def __init__(
        self,
        ex: Exchange,
        observer: SseObserver,
        transform: StreamTransform | None,
        writer: ChunkWriter | None,
        watch: IdleWatch,
        accounting: Accounting,
    ) -> None:
        self._ex = ex
        self._observer = observer
        self._transform = transform
        self.writer = writer
        """The server's, where it offers one: without it every chunk goes through the task."""
        self._watch = watch
        self._accounting = accounting
        self.pending = b""
        """Bytes for the client that the writer did not take: the task sends them."""
        self.error: Exception | None = None
        """What a chunk's handling raised (a bug): the task raises it."""
        self.relay_s = 0.0
        self.chunks = 0

    def feed(self, chunk: bytes, now: float) -> bytes:
        """One upstream chunk observed, counted and transformed: the bytes for the client (the
        caller times the step, the write included, into `relay_s`)."""
        self._watch.last = now
        self.chunks += 1
        observer, ex = self._observer, self._ex
        out = observer.feed(chunk, now)
        if observer.content_events - ex.streamed_tokens >= _COUNT_EVERY:
            self._accounting.count_streamed(ex, observer.content_events)
        if self._transform is not None:
            out = self._transform.feed(out)
        return out

    def __call__(self, chunk: bytes) -> bool:
        """The connection's sink (`UpstreamConnection.splice`): one chunk relayed now; False when
        the task must take over (the writer refused the bytes, kept in `pending`, or an error)."""
        t0 = time.perf_counter()
        try:
            out = self.feed(chunk, t0)
            if out and self.writer is not None and not self.writer.write(out):
                self.pending = out
                return False
            return self.writer is not None
        except Exception as exc:  # in the connection's callback: hand it to the task, which raises it
            self.error = exc  # (not to httptools, which would make it the backend's bad response)
            return False
        finally:
            self.relay_s += time.perf_counter() - t0


class StreamCut(Exception):
    """The upstream stream ended without its final event; carries the outcome to record."""

    def __init__(self, outcome: Outcome, message: str) -> None:
        super().__init__(message)
        self.outcome: Outcome = outcome
        self.message = message


class Relay:
    def __init__(
        self,
        metrics: GatewayMetrics,
        accounting: Accounting,
        lifecycle: Lifecycle,
        passive: PassiveHealth,
        idle_s: float,
        keepalive_s: float,
        first_token_s: float,
        max_response_bytes: int = 64 << 20,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    ) -> None:
        self._metrics = metrics
        self._passive = passive
        self._max_response_bytes = max_response_bytes
        self._max_event_bytes = max_event_bytes
        self._lifecycle = lifecycle
        self._accounting = accounting
        self._idle_s = idle_s
        self._keepalive_s = keepalive_s
        # The first token may take as long as the first byte may: engines that stream send their
        # headers at once, so a long prefill shows up as a wait for the first chunk.
        self._first_token_s = first_token_s

    async def body(self, dispatch: Dispatch, ex: Exchange, resp: UpstreamResponse, target: Target) -> Outcome:
        """Relay a whole answer; its outcome (the request's owner records it)."""
        protocol, inbound, send = dispatch.request.protocol, dispatch.request.inbound, dispatch.send
        raw = await resp.read(max(self._idle_s, self._first_token_s), self._max_response_bytes)
        resp.release()
        if ex.trace is not None and ex.trace.recording:
            ex.trace.content("gen_ai.completion", raw)
        ex.answer_id = protocol.answer_id(raw)
        try:
            parsed = json.loads(raw)
        except ValueError:
            raise UpstreamError(
                f"Backend {ex.backend_name} sent a response that is not JSON.", code="bad_upstream_response"
            ) from None
        usage = protocol.usage(parsed)
        if usage is not None:
            ex.usage = usage
            if engine_truncated(prompt_tokens(usage), ex.prompt_exact, ex.prompt_estimate):
                self._metrics.cap_actions.labels(ex.route, "engine_truncated", "usage").inc()
                expected = ex.prompt_exact or ex.prompt_estimate
                ex.headers.append(
                    (b"x-gateway-engine-truncated-prompt", f"{usage.get('prompt_tokens')}/{expected}".encode())
                )
        out = protocol.response_body(inbound, raw, parsed, target)
        if target.native and ex.served_model is not None:
            out = ModelRename(ex.served_model, inbound.model).whole(out)
        ex.status = 200
        ctype = resp.headers.get("content-type", "application/json").encode("latin-1")
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", ctype),
                    (b"content-length", str(len(out)).encode()),
                    *response_headers(ex),
                ],
            }
        )
        ex.response_started = True
        await send({"type": "http.response.body", "body": out, "more_body": False})
        return "success"

    async def stream(self, dispatch: Dispatch, ex: Exchange, resp: UpstreamResponse, target: Target) -> Outcome:
        """Relay a stream; its outcome (the request's owner records it). A client leaving, the idle
        limit and the drain deadline all arrive here as a cancellation from the request's owner,
        which knows why; this only closes the upstream."""
        protocol, inbound, send = dispatch.request.protocol, dispatch.request.inbound, dispatch.send
        observer = protocol.observer(inbound, dispatch.edits, target)
        observer.limit_events(self._max_event_bytes)
        transform = protocol.stream_transform(inbound, target)
        if transform is None and target.native and ex.served_model is not None:
            transform = ModelRename(ex.served_model, inbound.model)
        ex.observer = observer
        loop = resp.loop
        clock = time.perf_counter
        relay_s = 0.0
        chunks = 0
        watch = IdleWatch(self._idle_s, dispatch.owner, ex, resp, loop)
        splice: Splice | None = None
        try:
            first = await self._first_chunk(ex, send, resp)
            if not first and not ex.response_started:  # a clean, empty stream: retried by the attempts
                raise StreamCut("upstream_error_midstream", f"Backend {ex.backend_name} sent an empty stream.")
            t0 = clock()
            ex.answer_id = protocol.answer_id(first)
            out = observer.feed(first, t0) if first else b""
            # Once per request: a native observer may ask to see past the stream's preamble first.
            while first and not ex.response_started and getattr(observer, "holding", False):
                more = await self._first_chunk(ex, send, resp)
                if not more:
                    break
                out += observer.feed(more, clock())
            if observer.error is not None and not ex.response_started:
                assert ex.backend is not None
                raise _first_event_error(observer.error, ex.backend)
            if not ex.response_started:
                await self._start_stream(ex, send)
            if transform is not None:
                out = transform.feed(out)
            # Also when empty (a first read that holds no whole event yet): the server writes the
            # head with the first body message (serving/cycle.py), and the client gets it now.
            await send({"type": "http.response.body", "body": out, "more_body": True})
            relay_s += clock() - t0
            chunks += 1
            watch.last = clock()
            writer = ex.scope.get(BODY_WRITER) if ex.scope is not None else None  # the head is out now
            splice = Splice(ex, observer, transform, writer, watch, self._accounting)
            while first:
                if splice.writer is not None and resp.splice(splice):
                    await resp.wait_spliced()
                    if splice.error is not None:
                        raise splice.error
                    if splice.pending:
                        out, splice.pending = splice.pending, b""
                        await send({"type": "http.response.body", "body": out, "more_body": True})
                else:
                    chunk = await resp.readany()
                    if not chunk:
                        break
                    t0 = clock()
                    out = splice.feed(chunk, t0)
                    if out:
                        await send({"type": "http.response.body", "body": out, "more_body": True})
                    splice.relay_s += clock() - t0
            rest = observer.flush()
            if not observer.done:
                raise StreamCut(
                    "upstream_error_midstream", f"Backend {ex.backend_name} ended the stream before it was complete."
                )
            if transform is not None:
                rest = transform.feed(rest) + transform.finish()
            await send({"type": "http.response.body", "body": rest, "more_body": False})
            resp.release()
            return "success"
        except StreamCut as cut:
            resp.close()
            return await self.cut(ex, send, protocol, cut)
        except EventTooLarge as too_large:  # the engine misbehaves: cut it off, and count it against the backend
            # (its own name: mypyc types an `as` name once per function, by its first except clause)
            resp.close()
            message = f"Backend {ex.backend_name} sent an event longer than {too_large.limit} bytes."
            return await self.cut(ex, send, protocol, StreamCut("upstream_error_midstream", message))
        except (UpstreamError, UpstreamTimeout) as exc:  # a read failed mid-stream (mapped in upstream.py)
            resp.close()
            return await self.cut(ex, send, protocol, StreamCut("upstream_error_midstream", exc.message))
        except BaseException:  # cancelled (client left, idle, drain) or a bug: stop the engine's work
            resp.close()
            raise
        finally:
            watch.close()
            if splice is not None:  # the chunks after the first
                relay_s += splice.relay_s
                chunks += splice.chunks
            self._metrics.child(self._metrics.relay_seconds, ex.route).inc(relay_s)
            self._metrics.child(self._metrics.relay_chunks, ex.route).inc(chunks)

    async def _first_chunk(self, ex: Exchange, send: Send, resp: UpstreamResponse) -> bytes:
        """Wait for the first chunk, holding back the client's headers so that an error there can
        still become a proper HTTP error; past keepalive_s, start the stream and ping instead. A
        read that a ping's timer cuts loses nothing: its bytes stay in the connection's buffer.
        (One timer on this task, not a second task and asyncio.wait: ~10 us a stream less.)"""
        if resp.unread():  # the first chunk came with the head: no timer
            return await resp.readany()
        keepalive = self._keepalive_s
        loop = resp.loop
        deadline = loop.time() + self._first_token_s
        try:
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    raise TimeoutError
                try:
                    async with asyncio.timeout(left if keepalive <= 0 else min(keepalive, left)):
                        return await resp.readany()
                except TimeoutError:
                    if keepalive <= 0 or left <= keepalive:  # the deadline passed, not the ping interval: 504
                        raise
                if not ex.response_started:
                    await self._start_stream(ex, send)
                await send({"type": "http.response.body", "body": _PING, "more_body": True})
        except TimeoutError:
            raise StreamCut("timeout_ttfb", f"Backend {ex.backend_name} sent no first token in time.") from None

    async def _start_stream(self, ex: Exchange, send: Send) -> None:
        ex.status = 200
        await send({"type": "http.response.start", "status": 200, "headers": [*SSE, *response_headers(ex)]})
        ex.response_started = True

    async def cut(self, ex: Exchange, send: Send, protocol: ProtocolAdapter, cut: StreamCut) -> Outcome:
        """A stream that broke after the client got its headers: one error event, and no
        [DONE], so the client can tell a cut-off answer from a finished one; the backend gets a
        failure (docs/reliability.md defect 8), unless the stall was the client's (not reading).
        Before the client got its headers it raises instead, and the attempts count and retry.
        While the gateway drains, a backend that goes away is taken to go with it (one Ctrl-C stops
        both): the event says the gateway is shutting down, and nothing is counted against it.
        Returns the request's outcome, for its owner to record."""
        outcome: Outcome = cut.outcome
        if self._lifecycle.draining and cut.outcome == "upstream_error_midstream":
            if not ex.response_started:
                raise ShuttingDown()
            outcome = "overloaded"
            event = protocol.error_body(ShuttingDown())
            last = b"data: " + event + b"\n\n"
        else:
            if not ex.response_started:
                if cut.outcome == "timeout_ttfb":
                    raise UpstreamTimeout(cut.message)
                raise UpstreamError(cut.message, code="upstream_disconnected")
            kind = cut.outcome if cut.outcome in ("timeout_idle", "timeout_ttfb") else "midstream"
            if ex.backend is not None:
                self._passive.failure(ex.backend, kind, penalise=not ex.client_stalled)
            last = protocol.error_event(cut.message, cut.outcome)
        # A client that stopped reading (the reason the stream stalled, perhaps) must not hold this
        # task forever: give the last event a few seconds, then let uvicorn close the connection.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):
                await send({"type": "http.response.body", "body": last, "more_body": False})
        return outcome


def _first_event_error(error: dict[str, object], backend: Backend) -> GatewayError:
    """A 200 stream whose first event is an error becomes a proper HTTP error, normalised by the
    engine's adapter like any other error body (so a context error is still 400)."""
    inner = error.get("error", error)
    code = inner.get("code") if isinstance(inner, dict) else None
    status = code if isinstance(code, int) and 400 <= code < 600 else 502
    norm = backend.adapter.normalise_error(status, json.dumps(error).encode())
    if norm.status >= 500:
        return UpstreamError(norm.message, code="upstream_error_event")
    return EngineError(norm.message, status=norm.status, type_=norm.type, code=norm.code, param=norm.param)
