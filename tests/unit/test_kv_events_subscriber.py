"""The KV-event subscriber against an emulator of vLLM's ZmqEventPublisher (real ZMQ sockets in
process: a PUB socket, and a ROUTER that answers replay requests from a buffer, as
vllm/distributed/kv_events.py does), for the faults a real engine can't be made to produce on cue:
a lost batch, a late subscriber, a restart, a dropped connection, a replay socket that is gone.
The batches are the ones recorded from a real vLLM (tests/fixtures/kv_events/vllm.json)."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Generic, TypeVar

import pytest
import zmq
import zmq.asyncio

from gateway.fleet.kvevents import subscriber as subscriber_module
from gateway.fleet.kvevents.decode import decode_batch
from gateway.fleet.kvevents.index import EngineIndex
from gateway.fleet.kvevents.subscriber import EventSubscriber

pytestmark = pytest.mark.unit

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "kv_events" / "vllm.json"
PAYLOADS = [base64.b64decode(f[2]) for f in json.loads(FIXTURE.read_text(encoding="utf-8"))["frames"]]
TOPIC = b"kv"
T = TypeVar("T")


def bind(sock: zmq.asyncio.Socket, port: int = 0) -> int:
    """Bind to `port` (0: any), retrying while ZMQ's I/O thread still closes a socket that had it."""
    for _ in range(100):
        try:
            sock.bind(f"tcp://127.0.0.1:{port or '*'}")
            return int(sock.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EADDRINUSE:
                raise
            time.sleep(0.02)
    raise AssertionError(f"port {port} stayed in use")


class PublisherEmulator:
    """vLLM's publisher protocol: (topic, seq, payload) on PUB; a replay request (empty, start seq)
    on the ROUTER answered with (empty, topic, seq, payload) per buffered batch, then seq -1."""

    def __init__(self, ctx: zmq.asyncio.Context, pub_port: int = 0, replay_port: int = 0) -> None:
        self._ctx = ctx
        self.seq = 0
        self.buffer: list[tuple[int, bytes]] = []
        self.pub = ctx.socket(zmq.PUB)
        self.pub_port = bind(self.pub, pub_port)
        self.router = ctx.socket(zmq.ROUTER)
        self.replay_port = bind(self.router, replay_port)
        self.replay_requests = 0
        self._task = asyncio.get_running_loop().create_task(self._serve_replay())

    async def _serve_replay(self) -> None:
        while True:
            client, _, start = await self.router.recv_multipart()
            self.replay_requests += 1
            first = int.from_bytes(start, "big")
            for seq, payload in self.buffer:
                if seq >= first:
                    await self.router.send_multipart([client, b"", TOPIC, seq.to_bytes(8, "big"), payload])
            await self.router.send_multipart([client, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])

    async def publish(self, payload: bytes, *, send: bool = True) -> int:
        """Buffer the batch under the next seq; `send=False` loses it on the way (a dropped frame)."""
        seq = self.seq
        self.seq += 1
        self.buffer.append((seq, payload))
        if send:
            await self.pub.send_multipart([TOPIC, seq.to_bytes(8, "big"), payload])
        return seq

    def drop_connection(self) -> None:
        self.pub.close(linger=0)

    def reconnect(self) -> None:
        self.pub = self._ctx.socket(zmq.PUB)
        bind(self.pub, self.pub_port)

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self.pub.close(linger=0)
        self.router.close(linger=0)


async def until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def joined(sub: EventSubscriber, pub: PublisherEmulator) -> None:
    """Publish nothing until the SUB's subscription reached the PUB: ZMQ drops what a PUB sends
    before then (the slow-joiner case, which the first-batch replay covers on its own)."""
    await sub.connected.wait()
    await asyncio.sleep(0.3)


def expected_index(n: int, first: int = 0) -> EngineIndex:
    index = EngineIndex()
    for p in PAYLOADS[first:n]:
        index.apply(decode_batch(p))
    return index


def same(a: EngineIndex, b: EngineIndex) -> bool:
    return len(a) == len(b) and a._keys == b._keys


@pytest.fixture
async def ctx() -> AsyncIterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
async def pub(ctx: zmq.asyncio.Context) -> AsyncIterator[PublisherEmulator]:
    emulator = PublisherEmulator(ctx)
    yield emulator
    await emulator.close()


def start(
    ctx: zmq.asyncio.Context, pub: PublisherEmulator, replay: bool = True
) -> tuple[EventSubscriber, asyncio.Task[None]]:
    sub = EventSubscriber(
        ctx,
        f"tcp://127.0.0.1:{pub.pub_port}",
        index=EngineIndex(),
        replay_endpoint=f"tcp://127.0.0.1:{pub.replay_port}" if replay else None,
        topic="kv",
        name="e1",
    )
    return sub, asyncio.get_running_loop().create_task(sub.run())


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_batches_in_order_build_the_index(ctx: zmq.asyncio.Context, pub: PublisherEmulator) -> None:
    sub, task = start(ctx, pub)
    await joined(sub, pub)
    for p in PAYLOADS[:4]:
        await pub.publish(p)
    await until(lambda: sub.last_seq == 3)
    await stop(task)
    assert same(sub.index, expected_index(4)) and len(sub.index) > 0
    # One replay request: the catch-up at connect, which found nothing buffered.
    assert (sub.stats.batches, sub.stats.gaps, sub.stats.replays, pub.replay_requests) == (4, 0, 1, 1)
    assert sub.stats.replayed == 0


async def test_a_lost_batch_is_replayed(ctx: zmq.asyncio.Context, pub: PublisherEmulator) -> None:
    sub, task = start(ctx, pub)
    await joined(sub, pub)
    await pub.publish(PAYLOADS[0])
    await pub.publish(PAYLOADS[1], send=False)
    await pub.publish(PAYLOADS[2], send=False)
    await pub.publish(PAYLOADS[3])
    await until(lambda: sub.last_seq == 3)
    await stop(task)
    assert same(sub.index, expected_index(4))
    assert (sub.stats.gaps, sub.stats.replays, sub.stats.replayed, sub.stats.lost) == (1, 2, 2, 0)  # catch-up + gap


async def test_a_late_subscriber_learns_what_was_stored_before_it(
    ctx: zmq.asyncio.Context, pub: PublisherEmulator
) -> None:
    for p in PAYLOADS[:3]:
        await pub.publish(p)
    sub, task = start(ctx, pub)
    await joined(sub, pub)
    await pub.publish(PAYLOADS[3])
    await until(lambda: sub.last_seq == 3)
    await stop(task)
    assert same(sub.index, expected_index(4))
    assert (sub.stats.gaps, sub.stats.replays, sub.stats.replayed) == (0, 1, 3)


async def caught_up(ctx: zmq.asyncio.Context, pub: PublisherEmulator) -> EventSubscriber:
    """A subscriber that connected after the engine published three batches and then went idle,
    stopped once its catch-up replayed them."""
    for p in PAYLOADS[:3]:
        await pub.publish(p)
    sub, task = start(ctx, pub)
    try:
        await until(lambda: sub.last_seq == 2)  # nothing more is published: only the catch-up
    finally:
        await stop(task)
    return sub


async def test_a_subscriber_learns_an_idle_engines_cache_when_it_connects(
    ctx: zmq.asyncio.Context, pub: PublisherEmulator
) -> None:
    sub = await caught_up(ctx, pub)
    assert same(sub.index, expected_index(3)) and len(sub.index) > 0
    assert (sub.stats.replays, sub.stats.replayed, sub.stats.gaps, sub.stats.restarts) == (1, 3, 0, 0)
    assert sub.caught_up


async def test_a_long_catch_up_lets_the_event_loop_run_between_batches(
    ctx: zmq.asyncio.Context, pub: PublisherEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The replayed batches can all be queued before the first is applied: awaiting each then never
    # suspends, and the catch-up would hold the loop (and every request on it) to its end.
    monkeypatch.setattr(subscriber_module, "REPLAY_YIELD", 1)
    sleep = asyncio.sleep
    yields = 0

    async def counted(delay: float, *args: object) -> None:
        nonlocal yields
        yields += delay == 0
        await sleep(delay)

    monkeypatch.setattr(asyncio, "sleep", counted)
    sub = await caught_up(ctx, pub)
    assert sub.caught_up and sub.stats.replayed == 3 and yields >= 3


async def test_the_live_copies_of_batches_the_catch_up_replayed_are_skipped(
    ctx: zmq.asyncio.Context, pub: PublisherEmulator
) -> None:
    sub = await caught_up(ctx, pub)
    # What the SUB socket queued while the catch-up ran: batches 1 and 2 again, then a new one.
    for seq in (1, 2, 3):
        await sub.on_frames([TOPIC, seq.to_bytes(8, "big"), PAYLOADS[seq]])
    assert (sub.stats.restarts, sub.stats.batches, sub.last_seq) == (0, 4, 3)
    assert same(sub.index, expected_index(4))
    # Past the replayed batches, a sequence that goes back is an engine restart again.
    await sub.on_frames([TOPIC, (0).to_bytes(8, "big"), PAYLOADS[0]])
    assert sub.stats.restarts == 1 and same(sub.index, expected_index(1))


async def test_an_engine_that_restarts_after_an_idle_catch_up_is_not_taken_for_copies(
    ctx: zmq.asyncio.Context, pub: PublisherEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(subscriber_module, "COPIES_S", 0.05)
    sub = await caught_up(ctx, pub)
    await asyncio.sleep(0.1)
    # Nothing published since the catch-up; now a restarted engine's first batch, seq 0 again.
    await sub.on_frames([TOPIC, (0).to_bytes(8, "big"), PAYLOADS[4]])
    assert sub.stats.restarts == 1 and sub.last_seq == 0
    assert same(sub.index, expected_index(5, first=4))


async def test_an_engine_restart_resets_its_view(ctx: zmq.asyncio.Context, pub: PublisherEmulator) -> None:
    sub, task = start(ctx, pub)
    await joined(sub, pub)
    for p in PAYLOADS[:3]:
        await pub.publish(p)
    await until(lambda: sub.last_seq == 2)
    assert len(sub.index) > 0
    ports = pub.pub_port, pub.replay_port
    await pub.close()
    restarted = PublisherEmulator(ctx, *ports)  # a new engine process: seq from 0, an empty buffer
    try:
        await asyncio.sleep(0.5)  # the SUB reconnects on its own; what it misses meanwhile is replayed
        await restarted.publish(PAYLOADS[3])
        await restarted.publish(PAYLOADS[4])
        await until(lambda: sub.last_seq == 1)
    finally:
        await stop(task)
        await restarted.close()
    assert sub.stats.restarts == 1
    assert same(sub.index, expected_index(5, first=3))


async def test_a_dropped_connection_recovers_what_it_missed(ctx: zmq.asyncio.Context, pub: PublisherEmulator) -> None:
    sub, task = start(ctx, pub)
    await joined(sub, pub)
    await pub.publish(PAYLOADS[0])
    await until(lambda: sub.last_seq == 0)
    pub.drop_connection()
    await pub.publish(PAYLOADS[1], send=False)  # published while nobody is connected
    await pub.publish(PAYLOADS[2], send=False)
    pub.reconnect()
    await asyncio.sleep(0.5)
    await pub.publish(PAYLOADS[3])
    await until(lambda: sub.last_seq == 3)
    await stop(task)
    assert same(sub.index, expected_index(4))
    assert (sub.stats.gaps, sub.stats.replayed, sub.stats.restarts) == (1, 2, 0)


async def test_without_a_replay_socket_a_gap_is_counted_lost(ctx: zmq.asyncio.Context, pub: PublisherEmulator) -> None:
    sub, task = start(ctx, pub, replay=False)
    await joined(sub, pub)
    await pub.publish(PAYLOADS[0])
    await pub.publish(PAYLOADS[1], send=False)
    await pub.publish(PAYLOADS[2])
    await until(lambda: sub.last_seq == 2)
    await stop(task)
    assert (sub.stats.gaps, sub.stats.replays, sub.stats.lost, sub.stats.batches) == (1, 0, 1, 2)


async def test_a_replay_socket_that_never_answers_does_not_stall_the_stream(
    ctx: zmq.asyncio.Context, pub: PublisherEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(subscriber_module, "REPLAY_IDLE_S", 0.2)
    silent = ctx.socket(zmq.ROUTER)  # accepts the request, never answers
    port = bind(silent)
    sub = EventSubscriber(
        ctx, f"tcp://127.0.0.1:{pub.pub_port}", index=EngineIndex(), replay_endpoint=f"tcp://127.0.0.1:{port}"
    )
    task = asyncio.get_running_loop().create_task(sub.run())
    try:
        await joined(sub, pub)
        await pub.publish(PAYLOADS[0])
        await pub.publish(PAYLOADS[1], send=False)
        await pub.publish(PAYLOADS[2])
        await pub.publish(PAYLOADS[3])
        await until(lambda: sub.last_seq == 3)
    finally:
        await stop(task)
        silent.close(linger=0)
    assert (sub.stats.gaps, sub.stats.lost, sub.stats.batches) == (1, 1, 3)


async def test_frames_of_the_wrong_shape_are_counted_and_skipped(
    ctx: zmq.asyncio.Context, pub: PublisherEmulator
) -> None:
    sub, task = start(ctx, pub)
    await joined(sub, pub)
    await pub.pub.send_multipart([TOPIC, b"\x00"])
    await pub.pub.send_multipart([TOPIC, (0).to_bytes(8, "big"), b"\xc1"])
    await pub.pub.send_multipart([TOPIC, (1).to_bytes(8, "big"), PAYLOADS[0]])
    await until(lambda: sub.last_seq == 1)
    await stop(task)
    assert (sub.stats.undecodable, sub.stats.batches) == (2, 1)


@asynccontextmanager
async def live(ctx: zmq.asyncio.Context, pub: PublisherEmulator) -> AsyncIterator[EventSubscriber]:
    """A subscriber past its catch-up, its SUB joined to the publisher; stopped on leaving."""
    sub, task = start(ctx, pub)
    try:
        await joined(sub, pub)
        await until(lambda: sub.caught_up and not sub._readable)  # its first drain found nothing queued
        yield sub
    finally:
        await stop(task)


class Counted(Generic[T]):
    """A function that counts its calls."""

    def __init__(self, fn: Callable[..., T]) -> None:
        self.fn = fn
        self.calls = 0

    def __call__(self, *args: Any) -> T:
        self.calls += 1
        return self.fn(*args)


async def send(pub: PublisherEmulator, n: int) -> None:
    for p in PAYLOADS[:n]:
        await pub.publish(p)


async def queued(sub: EventSubscriber, pub: PublisherEmulator | None = None, n: int = 0) -> None:
    """Publish the first `n` batches, then wait until the socket signalled them (a burst arrives
    together). Asking the socket here would take its signal, which is edge-triggered, from the
    subscriber."""
    if pub is not None:
        await send(pub, n)
    await until(lambda: sub._readable)
    await asyncio.sleep(0.05)


async def test_a_request_applies_what_came_before_it_without_the_loop_waking_per_batch(
    ctx: zmq.asyncio.Context, pub: PublisherEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The task's own drain pushed out of the way: batches wait in the socket, not in the index,
    # until a request drains them; the loop is not woken for each.
    monkeypatch.setattr(subscriber_module, "DRAIN_S", 60.0)
    async with live(ctx, pub) as sub:
        await queued(sub, pub, 4)
        assert sub.last_seq is None and len(sub.index) == 0
        assert sub.drain() == 4
        assert sub.last_seq == 3 and same(sub.index, expected_index(4))
        assert sub.drain() == 0


async def test_a_gap_a_request_finds_is_replayed_by_the_task_at_once(
    ctx: zmq.asyncio.Context, pub: PublisherEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(subscriber_module, "DRAIN_S", 60.0)
    async with live(ctx, pub) as sub:
        await pub.publish(PAYLOADS[0])
        await pub.publish(PAYLOADS[1], send=False)
        await pub.publish(PAYLOADS[2])
        await queued(sub)
        assert sub.drain() == 2  # batch 0 applied; batch 2 held for the task, which replays 1 first
        assert sub.last_seq == 0
        await until(lambda: sub.last_seq == 2, timeout=2.0)  # well before DRAIN_S: the task was woken
        assert same(sub.index, expected_index(3))
        assert (sub.stats.gaps, sub.stats.replayed, sub.stats.lost) == (1, 1, 0)


async def test_a_backlog_is_applied_in_slices(
    ctx: zmq.asyncio.Context, pub: PublisherEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(subscriber_module, "DRAIN_S", 60.0)
    monkeypatch.setattr(subscriber_module, "DRAIN_MAX", 2)
    async with live(ctx, pub) as sub:
        await queued(sub, pub, 5)
        assert sub.drain() == 2 and sub.last_seq == 1
        assert sub.drain() == 2 and sub.last_seq == 3
        assert sub.drain() == 1 and same(sub.index, expected_index(5))


async def test_without_requests_the_task_applies_the_stream_on_its_own(
    ctx: zmq.asyncio.Context, pub: PublisherEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(subscriber_module, "DRAIN_S", 0.05)
    async with live(ctx, pub) as sub:
        await send(pub, 4)
        await until(lambda: sub.last_seq == 3, timeout=2.0)
        assert same(sub.index, expected_index(4))


async def test_an_idle_stream_costs_no_wake_ups(
    ctx: zmq.asyncio.Context, pub: PublisherEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The task waits for the socket to become readable, not on a timer: a fleet of idle engines
    # must not wake the loop DRAIN_S after DRAIN_S for each of them.
    monkeypatch.setattr(subscriber_module, "DRAIN_S", 0.01)
    drains = Counted(EventSubscriber.drain)
    monkeypatch.setattr(EventSubscriber, "drain", lambda self: drains(self))
    async with live(ctx, pub) as sub:
        await asyncio.sleep(0.3)
        assert drains.calls <= 2  # the first, before the first wait
        await pub.publish(PAYLOADS[0])
        await until(lambda: sub.last_seq == 0, timeout=2.0)
        settled = drains.calls
        await asyncio.sleep(0.3)
        assert drains.calls <= settled + 1


async def test_a_request_asks_an_idle_socket_nothing(
    ctx: zmq.asyncio.Context, pub: PublisherEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every request drains each backend's subscriber: with nothing signalled that is a flag test,
    # not a call into ZMQ.
    monkeypatch.setattr(subscriber_module, "DRAIN_S", 60.0)
    asked = Counted(subscriber_module._get)
    monkeypatch.setattr(subscriber_module, "_get", asked)
    async with live(ctx, pub) as sub:
        before = asked.calls  # the task's first drain, which found the queue empty
        assert [sub.drain() for _ in range(100)] == [0] * 100
        assert asked.calls == before
        await queued(sub, pub, 1)
        signalled = asked.calls
        assert sub.drain() == 1 and asked.calls == signalled + 2  # the batch, then the empty queue
        assert sub.drain() == 0 and asked.calls == signalled + 2
