"""One engine's KV-event stream kept in its index: a ZMQ SUB socket connected to the engine's PUB
endpoint, each batch applied in sequence order. A gap in the sequence is filled from the engine's
replay socket (a ROUTER: send `(empty, start seq)`, get `(empty, topic, seq, payload)` per buffered
batch, then a seq of -1); a sequence that goes back means the engine restarted, so its view is
dropped and rebuilt from its replay buffer. On connecting, the subscriber asks the replay socket
for everything the engine buffered: that is how a gateway that starts after the engine learns what
is already cached, before its first request rather than when the engine next publishes (the live
stream's copies of the batches replayed then are skipped). Without a replay socket, or when the
engine was not up yet, the first batch heard triggers that replay instead.

The live stream is not awaited message by message: the batches wait in the socket's queue and are
applied when a request is about to be matched (drain(), a non-blocking read once the socket has
signalled), and otherwise by the subscriber's task DRAIN_S after the socket signalled (no wake-up
at all while the engine is idle). An awaited receive wakes the event loop for every batch, and that wake-up cost several
times the batch's decoding (benchmarks/kv_feed.py); a match drained first also sees every batch
the loop has been told of, where an awaited receive may still have some queued behind the request."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Final, cast

import zmq
import zmq.asyncio

from gateway.fleet.kvevents.decode import EventDecodeError, TypedDecoder, decode_batch
from gateway.fleet.kvevents.index import EngineIndex

log = logging.getLogger(__name__)

END_SEQ = -1
REPLAY_YIELD = 32
"""Replayed batches applied between two turns of the event loop: a replay socket's answer arrives
faster than it is applied, so without a pause a catch-up through an engine's whole buffer (10,000
batches by default) would hold the loop, and every request on it, for as long as it takes."""
REPLAY_IDLE_S = 2.0
"""A replay answer that pauses this long has ended (the engine died, or speaks no replay)."""
COPIES_S = 1.0
"""After the catch-up at connect, how long a batch it already replayed may still come on the live
stream (queued on the SUB socket meanwhile) and be skipped as a copy. Past it, a sequence that goes
back is an engine restart, as always: an engine that restarts soon after an idle spell must not
have its first batches taken for copies."""
DRAIN_S = 0.05
"""How long after the socket became readable the task applies what it queued (when no request has
drained it meanwhile): the batches of that span are applied in one wake-up."""
DRAIN_MAX = 64
"""Batches applied in one drain: a request (or the task, before the loop's next turn) applies at
most this many, so that a backlog is worked off in slices between other work."""
RCV_HWM = 100_000
"""Batches the socket queues before it drops (a dropped batch is a gap, filled by a replay)."""
EVENTS: Final = int(zmq.EVENTS)
POLLIN: Final = int(zmq.POLLIN)
_get = zmq.backend.Socket.get


def _pollin(sock: zmq.Socket[bytes]) -> bool:
    """Whether a batch is queued. Read as a plain int: pyzmq's own Socket.get makes an enum of the
    events, which costs more than the read itself."""
    return bool(cast(int, _get(sock, EVENTS)) & POLLIN)


@dataclass
class SubscriberStats:
    """Counters since start; read by the metrics collector."""

    batches: int = 0
    events: int = 0
    gaps: int = 0
    """Sequence gaps seen (each triggers one replay when the engine has a replay socket)."""
    replays: int = 0
    replayed: int = 0
    """Batches applied from replay answers."""
    lost: int = 0
    """Batches neither heard nor replayed: the view may hold blocks the engine has since dropped."""
    restarts: int = 0
    undecodable: int = 0


class EventSubscriber:
    """Follows one engine until cancelled; `index` is its view, owned by this task alone."""

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        endpoint: str,
        *,
        index: EngineIndex,
        replay_endpoint: str | None = None,
        topic: str = "",
        engine: str = "vllm",
        name: str = "",
    ) -> None:
        self._ctx = ctx
        self.endpoint = endpoint
        self._replay_endpoint = replay_endpoint
        self._topic = topic.encode()
        self._engine = engine
        self._typed = TypedDecoder()
        self.name = name or endpoint
        self.index = index
        self.stats = SubscriberStats()
        self.last_seq: int | None = None
        self.connected = asyncio.Event()
        """Set once the SUB socket is connected (a test's publisher may start sending then)."""
        self._live: zmq.Socket[bytes] | None = None
        """The live stream's socket read without awaiting (drain()), once the catch-up is done."""
        self._held: list[bytes] | None = None
        """A batch drain() read that needs a replay first (a gap, a restart): the task's to apply."""
        self._nudge: asyncio.Future[None] | None = None
        """What the task awaits between drains: done DRAIN_S after the socket became readable, or
        at once when a request's drain() holds a batch."""
        self._timer: asyncio.TimerHandle | None = None
        """The task's next drain, armed when the socket becomes readable."""
        self._readable = False
        """The socket signalled batches that no drain has read to the end since: a request's
        drain() reads nothing (and asks the socket nothing) while it is False."""
        self._replayed_to: int | None = None
        """The last batch the catch-up at connect replayed, while the live stream may still deliver
        copies of it and of those before it; None once a later batch is heard."""
        self._copies_until = 0.0
        self.caught_up = False
        """Whether the catch-up at connect is over (or there was none to make): the view holds what
        the engine buffered before this subscriber connected."""

    async def run(self) -> None:
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, self._topic)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, RCV_HWM)
        sub.connect(self.endpoint)
        self.connected.set()
        try:
            if self._replay_endpoint is not None:
                await self._catch_up()
            self.caught_up = True
            live = self._live = zmq.Socket.shadow(sub.underlying)
            self._readable = True  # what came during the catch-up
            loop = asyncio.get_running_loop()
            fd = int(live.getsockopt(zmq.FD))
            loop.add_reader(fd, self._signalled)
            try:
                while True:
                    held, self._held = self._held, None
                    if held is not None:
                        await self.on_frames(held)
                    if self.drain() < DRAIN_MAX and not self._holding():
                        self._nudge = loop.create_future()
                        await self._nudge
                    else:
                        await asyncio.sleep(0)
            finally:
                loop.remove_reader(fd)
        finally:
            if self._timer is not None:
                self._timer.cancel()
            self._live = None
            sub.close(linger=0)

    def _holding(self) -> bool:
        """A method, not `self._held is None` inline: mypy keeps the None it narrowed `_held` to
        across the drain() call that may set it, and the compiled build checks that type."""
        return self._held is not None

    def _signalled(self) -> None:
        """The socket's descriptor woke the loop. ZMQ's signal is edge-triggered and reading the
        socket's events clears it: the next one comes when a batch arrives on an emptied queue."""
        live = self._live
        if live is not None and _pollin(live):
            self._readable = True
            self._due_soon()

    def _due_soon(self) -> None:
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(DRAIN_S, self._due)

    def _due(self) -> None:
        self._timer = None
        if self._nudge is not None:
            _wake(self._nudge)

    def drain(self) -> int:
        """Apply, in order, what the live socket holds now (DRAIN_MAX batches at most); a batch that
        needs a replay first is left to the task. Returns how many batches were read."""
        live = self._live
        if live is None or not self._readable or self._held is not None:
            return 0
        read = 0
        while read < DRAIN_MAX:
            if not _pollin(live):
                self._readable = False  # the next batch signals again: it finds the queue empty
                break
            frames = live.recv_multipart(zmq.NOBLOCK)
            read += 1
            if not self._take(frames):
                self._held = frames
                if self._nudge is not None:
                    _wake(self._nudge)
                break
        else:
            self._due_soon()  # DRAIN_MAX read: more may be queued, and no signal comes for those
        return read

    def _take(self, frames: list[bytes]) -> bool:
        """Apply a batch that follows the last one (or drop an undecodable one, or a copy of one the
        catch-up replayed); False: it needs a replay first (on_frames)."""
        if len(frames) != 3 or len(frames[1]) != 8:
            self.stats.undecodable += 1
            return True
        seq = int.from_bytes(frames[1], "big", signed=True)
        if self._replayed_to is not None:
            if seq <= self._replayed_to and asyncio.get_running_loop().time() < self._copies_until:
                return True  # queued on the SUB socket while the catch-up replayed it
            self._replayed_to = None
        last = self.last_seq
        if seq == (0 if last is None else last + 1):
            self._apply(seq, frames[2])
            return True
        return False

    async def on_frames(self, frames: list[bytes]) -> None:
        """One published message: (topic, 8-byte big-endian seq, msgpack batch)."""
        if self._take(frames):
            return
        seq = int.from_bytes(frames[1], "big", signed=True)
        last = self.last_seq
        if last is None:
            if seq > 0:
                await self._replay(0, seq)
        elif seq <= last:
            log.info("KV events of %s: sequence went back from %d to %d; engine restarted", self.name, last, seq)
            self.stats.restarts += 1
            self.index.clear()
            self.last_seq = None
            if seq > 0:
                await self._replay(0, seq)
        elif seq > last + 1:
            self.stats.gaps += 1
            await self._replay(last + 1, seq)
        self._apply(seq, frames[2])

    def _apply(self, seq: int, payload: bytes) -> None:
        try:
            batch = decode_batch(payload, self._engine, self._typed)
        except EventDecodeError as exc:
            log.warning("KV events of %s: batch %d undecodable: %s", self.name, seq, exc)
            self.stats.undecodable += 1
        else:
            self.index.apply(batch)
            self.stats.batches += 1
            self.stats.events += len(batch.events)
        self.last_seq = seq

    async def _catch_up(self) -> None:
        """Everything the engine buffered, asked once at connect. An engine that does not answer
        (not started yet) is not a warning: its first batch heard triggers the replay then."""
        self.stats.replays += 1
        got = await self._fetch(0, None, quiet=True)
        self.stats.replayed += got
        self._replayed_to = self.last_seq
        self._copies_until = asyncio.get_running_loop().time() + COPIES_S

    async def _replay(self, start: int, upto: int) -> None:
        """Apply the buffered batches start..upto-1; count those the engine no longer has."""
        want = upto - start
        got = 0
        if self._replay_endpoint is not None:
            self.stats.replays += 1
            got = await self._fetch(start, upto)
            self.stats.replayed += got
        if got < want:
            log.warning("KV events of %s: %d of batches %d..%d lost", self.name, want - got, start, upto - 1)
            self.stats.lost += want - got

    async def _fetch(self, start: int, upto: int | None, quiet: bool = False) -> int:
        """Apply the replayed batches from `start` (to `upto`, excluded; None: all the engine has)."""
        assert self._replay_endpoint is not None
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self._replay_endpoint)
        got = 0
        try:
            await dealer.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                try:
                    reply = await asyncio.wait_for(dealer.recv_multipart(), REPLAY_IDLE_S)
                except TimeoutError:
                    (log.debug if quiet else log.warning)(
                        "KV events of %s: replay from %d stopped answering", self.name, start
                    )
                    return got
                if len(reply) != 4 or len(reply[2]) != 8:
                    self.stats.undecodable += 1
                    continue
                seq = int.from_bytes(reply[2], "big", signed=True)
                if seq == END_SEQ:
                    return got
                if start <= seq and (upto is None or seq < upto) and (self.last_seq is None or seq > self.last_seq):
                    self._apply(seq, reply[3])
                    got += 1
                    if got % REPLAY_YIELD == 0:
                        await asyncio.sleep(0)
        finally:
            dealer.close(linger=0)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
