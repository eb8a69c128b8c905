"""Run the gateway in a background thread (its own event loop, a real uvicorn server on a real
socket) in front of real engines, for the synchronous integration tests."""

from __future__ import annotations

import asyncio
import functools
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from gateway.app.instance import Gateway
from gateway.config_loader import parse_config
from gateway.policy.rules import Platform
from gateway.serving.server import GatewayServer, uvicorn_config


class GatewayThread:
    def __init__(self, data: dict[str, Any], platform: Platform = "nvidia_gpu") -> None:
        self.config = parse_config(data, env={})
        self._uv = uvicorn_config(self.config, "127.0.0.1", 0, platform=platform, log_level="warning")
        self.server = GatewayServer(self._uv)
        self._thread = threading.Thread(target=self._run, name="gateway", daemon=True)
        self.base_url = ""

    def _run(self) -> None:
        asyncio.run(self.server.serve())

    def start(self) -> GatewayThread:
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the gateway did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}"
        return self

    @property
    def native_id(self) -> int:
        """The OS id of the thread that runs the gateway's event loop (its CPU time: /proc/self/task/ID)."""
        assert self._thread.native_id is not None, "not started"
        return self._thread.native_id

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=15)

    @property
    def gateway(self) -> Gateway:
        app = self._uv.loaded_app
        while not hasattr(app, "state"):
            app = app.app
        gw: Gateway = app.state.gateway
        return gw

    def settle(self, timeout: float = 5.0) -> None:
        """Wait until no request is being handled: the endpoint accounts a request (its metrics, the
        access log) in its `finally`, just after the client has the last byte, so a test that reads a
        metric right after a response would otherwise race the gateway's own thread."""
        deadline = time.monotonic() + timeout
        while not self.idle():
            if time.monotonic() > deadline:
                raise TimeoutError(f"a request was still being handled after {timeout} s")
            time.sleep(0.005)

    def idle(self) -> bool:
        """No request is being handled."""
        return all(t.done() for t in list(self.server.server_state.tasks))

    def metric(self, name: str, **labels: str) -> float:
        """The sum of a metric's samples with these labels, once every request in flight is accounted."""
        self.settle()
        return self.metric_now(name, **labels)

    def metric_now(self, name: str, **labels: str) -> float:
        """metric() without waiting for the requests in flight (one may be stuck)."""
        total = 0.0
        for family in self.gateway.metrics.registry.collect():
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    total += s.value
        return total


@contextmanager
def running_gateway(data: dict[str, Any], platform: Platform = "nvidia_gpu") -> Iterator[GatewayThread]:
    gw = GatewayThread(data, platform).start()
    try:
        yield gw
    finally:
        gw.stop()


def engine_metric(metrics_url: str, name: str) -> float:
    """Sum of one metric's samples in an engine's own /metrics."""
    text = httpx.get(metrics_url, timeout=5).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_for(predicate: Any, timeout: float, interval: float = 0.05) -> float:
    """Poll until predicate() is true; returns seconds waited, raises TimeoutError."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"condition not met within {timeout} s")
        time.sleep(interval)
    return time.monotonic() - start


class ProcessStalls:
    """A thread of this process that wakes every 10 ms and keeps the longest gap between two of its
    wakes since `reset()`. A gap of seconds means the whole process did not run: an overloaded
    machine (engines busy-polling every core) left it without a CPU. Gateway code cannot make such
    a gap by being slow or by blocking its own event loop, since another thread still gets the GIL
    every few milliseconds; it could only by holding the GIL in one long C call."""

    def __init__(self) -> None:
        self._longest = 0.0
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-probe", daemon=True)

    def __enter__(self) -> ProcessStalls:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=1)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            now = time.monotonic()
            self._longest = max(self._longest, now - self._last)
            self._last = now

    def reset(self) -> None:
        self._longest, self._last = 0.0, time.monotonic()

    def longest(self) -> float:
        """The longest the process went without running, in seconds, since reset()."""
        return max(self._longest, time.monotonic() - self._last)


def idle_within(predicate: Any, timeout: float, interval: float = 0.02) -> float:
    """Poll until predicate() is true (giving up after `timeout`); return how long after the call
    the *successful poll started*. A busy engine can take a second to answer its /metrics, and that
    answer's latency is not the engine's reaction time."""
    start = time.monotonic()
    while True:
        issued = time.monotonic()
        if predicate():
            return issued - start
        if issued - start > timeout:
            raise TimeoutError(f"condition not met within {timeout} s")
        time.sleep(interval)


def vllm_stops_when_left(
    gw: GatewayThread, metrics_url: str, leave: Callable[[], object], max_tokens: int, **labels: str
) -> None:
    """Leave a long vLLM stream through the gateway and prove the engine stopped: its token counter
    ends short of `max_tokens` and stays put for a second, and the gateway counted a mid-stream
    disconnect (with `labels`, e.g. api="messages"), and the engine went idle within a second of the
    client leaving. (vLLM answers /metrics only after the stream it is serving, so "still busy when
    the client left" cannot be asked directly.)

    Now and then vLLM's API server on a CPU hands over a whole stream only after its engine has
    finished it (measured here: about one fresh server in six, more on a busy machine); a client
    cannot leave such a stream in the middle, so that try proves nothing and is made again. A gateway
    that does not close the upstream fails every try.

    Its API server can also stall the other way: the gateway has ended the request (its task is
    done, and the relay closes the upstream connection on the way out) within half a second, yet
    the engine goes on for seconds and then records the request as aborted. The abort came from the
    closed connection, late; that try too is made again. A gateway that does not close the upstream
    lets the engine run on to the answer's end (checked: over 15 s here), which records it as
    finished, not aborted.

    And the machine can stall the gateway's whole process for seconds while the engine goes on
    generating (measured here beside a busy vLLM on two cores: 4 to 19 s in which no thread of the
    process ran). Such a stall is taken off the reaction time (`ProcessStalls`), and a try that was
    slow only by it is made again."""

    def generated() -> float:
        return engine_metric(metrics_url, "vllm:generation_tokens_total")

    def running() -> float:
        return engine_metric(metrics_url, "vllm:num_requests_running")

    def finished() -> dict[str, float]:
        """vLLM's finished requests by reason (stop, length, abort, ...)."""
        text = httpx.get(metrics_url, timeout=5).text
        return {
            reason: sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("vllm:request_success_total{") and f'finished_reason="{reason}"' in line
            )
            for reason in ("stop", "length", "abort", "error")
        }

    def disconnects() -> float:
        """The gateway's mid-stream disconnects, read without waiting for a request that may be stuck."""
        return gw.metric_now("gateway_client_disconnects_total", stage="mid_stream", **labels)

    whole = late = stalled = 0
    with ProcessStalls() as stalls:
        for _ in range(_LEAVE_TRIES):
            before, reasons_before = generated(), finished()
            left_before = gw.metric("gateway_client_disconnects_total", stage="mid_stream", **labels)
            left_at = time.monotonic()
            leave()
            stalls.reset()
            waiting_from = time.monotonic()
            try:
                gateway_done = idle_within(gw.idle, timeout=15)
            except TimeoutError:
                waited, frozen = time.monotonic() - waiting_from, stalls.longest()
                if waited - frozen < 1.0:  # the process hardly ran while it waited: try again
                    idle_within(gw.idle, timeout=60)
                    stalled += 1
                    continue
                raise AssertionError(
                    f"the gateway was still handling the request {waited:.1f} s after the client left; it "
                    f"counted {disconnects() - left_before:.0f} mid-stream disconnect(s), vLLM generated "
                    f"{generated() - before:.0f} tokens, and the gateway's process went {frozen:.2f} s at most "
                    "without running"
                ) from None
            took = idle_within(lambda: running() == 0, timeout=15) + gateway_done
            settled = generated()
            frozen = stalls.longest()
            if settled - before >= max_tokens:  # the engine finished before the client could leave
                whole += 1
                continue
            if took >= 1.0:  # which side: an engine that aborted late, or a gateway that never closed?
                reasons = {k: v - reasons_before[k] for k, v in finished().items() if v != reasons_before[k]}
                if gateway_done < 0.5 and reasons == {"abort": 1.0}:
                    late += 1
                    continue
                if took - frozen < 1.0:  # slow only while the process could not run
                    stalled += 1
                    continue
                raise AssertionError(
                    f"vLLM was still running {took:.2f} s after the client left: it generated "
                    f"{settled - before:.0f} tokens and finished with {reasons}; the gateway ended the request "
                    f"{gateway_done:.2f} s after the client left ({time.monotonic() - left_at:.1f} s ago) and "
                    f"counted {disconnects() - left_before:.0f} mid-stream disconnect(s); the gateway's process went "
                    f"{frozen:.2f} s at most without running"
                )
            assert gw.metric("gateway_client_disconnects_total", stage="mid_stream", **labels) == left_before + 1
            with pytest.raises(TimeoutError):  # and over the next second nothing more is generated for it
                wait_for(lambda end=settled: generated() != end, timeout=1.0)
            return
    raise EngineRanAhead(
        f"of {_LEAVE_TRIES} tries, vLLM generated all {max_tokens} tokens in {whole} (the stream was not cut), "
        f"aborted late, with the gateway's request long ended, in {late}, and was slow only while the "
        f"gateway's process could not run in {stalled}"
    )


_LEAVE_TRIES = 4
_FRESH_SERVERS = 2


class EngineRanAhead(AssertionError):
    """Every try on one vLLM server ended with the whole answer generated, aborted late by a
    stalled API server after the gateway had ended the request, or was slow only while the machine
    gave the gateway's process no CPU."""


def vllm_frees_when_left(
    vllm_long_server: Any,
    engine_launcher: Callable[..., Any],
    data_for: Callable[[str], dict[str, Any]],
    leave: Callable[[GatewayThread], object],
    max_tokens: int,
    **labels: str,
) -> None:
    """vllm_stops_when_left on the session's vLLM server with a 4,096-token window and two
    sequences (conftest's `vllm_long_server`), behind a gateway configured by `data_for(server_url)`.
    The servers that hand whole streams over do so on every try (it is the server, not the try), so
    when that one does, the witness is made once more on a fresh server of the same settings; a
    gateway that does not close the upstream fails on both."""
    for fresh in range(_FRESH_SERVERS):
        server = vllm_long_server if fresh == 0 else engine_launcher("vllm", max_model_len=4096, max_num_seqs=2)
        try:
            with running_gateway(data_for(server.base_url)) as gw:
                vllm_stops_when_left(gw, server.metrics_url, functools.partial(leave, gw), max_tokens, **labels)
            return
        except EngineRanAhead:
            if fresh == _FRESH_SERVERS - 1:
                raise
        finally:
            if server is not vllm_long_server:
                server.stop()


def llamacpp_frees_when_left(
    engine_launcher: Callable[..., Any],
    data_for: Callable[[str], dict[str, Any]],
    leave: Callable[[GatewayThread], object],
    **labels: str,
) -> None:
    """Leave a long llama.cpp stream through the gateway (`leave(gw)`, on a one-slot server of
    its own behind a gateway configured by `data_for(server_url)`) and prove the engine stopped
    work: it decoded fewer than `_LLAMACPP_STOPPED` more tokens after the client left, its slot is
    free again, and the gateway counted a mid-stream disconnect (with `labels`).

    The witness is the engine's decode count, not how soon its slot reads as free: the tiny model's
    4,096-token training window caps the slot whatever -c asks, so the whole answer is 4,078 tokens,
    one to three seconds here, and the busy flag of a slot that stopped at once can lag by a large
    part of that on a loaded machine; and /slots, asked while the slot decodes, can answer only
    after the answer is done, so the client leaves without asking it first. The count starts when the
    client has left. A gateway that keeps the upstream open lets the engine decode the rest of the
    answer, so a try is made again when less than twice the bound was left to decode when the
    client left (the engine had finished, or nearly: it cannot tell), and when the gateway's whole
    process stalled for half a second or more while the engine decoded past the bound (an
    overloaded machine: `ProcessStalls`)."""
    server = engine_launcher("llamacpp", ctx_per_slot=8192, parallel=1)

    def busy() -> bool:
        return any(s.get("is_processing") for s in httpx.get(server.base_url + "/slots", timeout=5).json())

    def decoded() -> float:
        return engine_metric(server.metrics_url, "llamacpp:n_decode_total")

    with running_gateway(data_for(server.base_url)) as gw, ProcessStalls() as stalls:
        for _ in range(_LEAVE_TRIES):
            before = decoded()
            leave(gw)
            left = decoded()
            stalls.reset()
            gateway_done = idle_within(gw.idle, timeout=15)
            freed = idle_within(lambda: not busy(), timeout=10) + gateway_done
            spent = decoded() - left
            frozen = stalls.longest()
            last = f"decoded {left - before:.0f} before the client left, {spent:.0f} after; stalled {frozen:.2f} s"
            if _LLAMACPP_WHOLE - (left - before) < 2 * _LLAMACPP_STOPPED:  # left too late to tell: made again
                continue
            if spent >= _LLAMACPP_STOPPED and frozen >= 0.5:  # the process could not run: made again
                continue
            assert spent < _LLAMACPP_STOPPED, (
                f"llama.cpp decoded {spent:.0f} more tokens after the client left (it had decoded "
                f"{left - before:.0f}; the whole answer: {_LLAMACPP_WHOLE}); the gateway ended its request "
                f"{gateway_done:.2f} s after the client left, the slot was free after {freed:.2f} s, and the "
                f"gateway's process went {frozen:.2f} s at most without running"
            )
            wait_for(lambda: gw.metric("gateway_client_disconnects_total", stage="mid_stream", **labels) >= 1, 5)
            return
        raise AssertionError(
            f"in all {_LEAVE_TRIES} tries the client left too late to tell, or the gateway's process stalled "
            f"(the last: {last})"
        )


_LLAMACPP_WHOLE = 4078
"""The tokens of the whole answer: the tiny model's 4,096-token window less the prompt's."""
_LLAMACPP_STOPPED = 1000
"""Tokens decoded after the client left: the engine notices the closed connection at its next token;
1,000 leaves a second of this machine's decoding for the gateway's reaction and the engine's, and is
a quarter of the whole answer."""


def leave_mid_stream(
    gw: GatewayThread,
    path: str,
    body: dict[str, Any],
    marker: bytes,
    engine_busy: Callable[[], bool] | None = None,
    headers: str = "",
) -> bytes:
    """POST a streamed `body` to `path` on a raw socket, read until `marker` (one per content event)
    has come three times, check `engine_busy()` (polled gently for up to 5 s: an engine's running
    gauge can lag its first tokens, and a big /metrics fetched hundreds of times a second starves a
    small machine), then vanish. Returns what was read."""
    host, port = gw.base_url.removeprefix("http://").split(":")
    raw = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{headers}"
    started = time.monotonic()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(f"{head}content-length: {len(raw)}\r\n\r\n".encode() + raw)
        got = b""
        while got.count(marker) < 3:
            chunk = sock.recv(4096)
            assert chunk, got
            got += chunk
        if engine_busy is not None:
            first = time.monotonic() - started
            try:
                wait_for(engine_busy, timeout=5.0, interval=0.1)
            except TimeoutError:
                raise AssertionError(
                    f"the engine never showed the request running (3 events after {first:.2f} s); it may "
                    "have finished before the client left, and then the test proves nothing"
                ) from None
    return got
