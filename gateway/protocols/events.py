"""Cut an SSE byte stream, read by read, into whole events (LF line ends): each byte is searched
once however long an event grows, and an event past the size limit is refused, so that a read costs
what it brings and one hostile event cannot hold the event loop or the memory."""

from __future__ import annotations

import json
from typing import Any, Final

DEFAULT_MAX_EVENT_BYTES: Final = 2 << 20
"""limits.max_event_bytes' default (gateway/config/settings.py): far above any token delta, and above the
final Responses event that carries a whole long answer (~0.5 MB for 100k tokens of English). Not
higher: the bytes a hostile backend sends before its stream is cut delay every other request on
the process (docs/reliability.md, "Backend isolation": with no limit a healthy route's p99 was 7-8
times its quiet one, at 2 MiB 1.7-2 times), and a translator holds and decodes each event whole."""


class EventTooLarge(Exception):
    """An upstream SSE event grew past the limit: the engine misbehaves (no client asks for it)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"an SSE event longer than {limit} bytes")
        self.limit = limit


def has(data: bytes, marker: bytes) -> bool:
    """`marker in data`, at a third of its cost where the marker is absent (CPython 3.11's bytes
    `in` first tries the marker as an int, and makes and drops a TypeError each time; `find` and
    `count` parse their arguments from a tuple; `partition` takes one argument as it is)."""
    return bool(data.partition(marker)[1])


LONG: Final = 64 << 10
"""An unfinished event past this many bytes is long: far past any token delta or usage event."""


class EventSplitter:
    """Feed it reads; it returns the whole events each completes (b"" when none). The bytes of an
    unfinished event are kept as a list of the reads that brought them and joined once, when the
    event ends: a 48 MB event in 64 KiB reads is 48 MB searched once, not ~18 GB re-scanned.
    `scanned` counts the bytes searched for a boundary (the tests' measure of the work).

    With `keep=False` (an observer that relays the reads as they come) a long event is not held: its
    bytes go out as they come (`passed`, set by each feed: they come before the returned events),
    and only its first and last LONG bytes are kept, to be read once it ends (`ended`): a long
    event costs no copy and no search but the boundary's, and its memory is bounded by 2 * LONG."""

    __slots__ = (
        "_cr",
        "_dropped",
        "_held",
        "_keep",
        "_nl",
        "_parts",
        "_tail",
        "ended",
        "limit",
        "long",
        "passed",
        "scanned",
    )

    def __init__(self, limit: int = DEFAULT_MAX_EVENT_BYTES, keep: bool = True) -> None:
        self._parts: list[bytes] = []
        self._held = 0
        """Bytes of the unfinished event so far (in _parts, or passed on)."""
        self._tail = 0
        """Bytes in _parts[1:] once the event is long (its tail)."""
        self._dropped = False
        """The unfinished event is long and its middle is gone (keep=False): _parts[0] is its head."""
        self._keep = keep
        self._nl = False
        """The held bytes end with a line end (a blank line may start in the next read)."""
        self._cr = False
        """The last read ended in CR: whether it is CRLF or a lone CR, the next byte says."""
        self.limit = limit
        self.scanned = 0
        self.passed = b""
        """keep=False: bytes of a long event this read brought, to relay before the returned events."""
        self.ended: bytes | None = None
        """keep=False: the head and tail of a long event this read ended (its middle left out)."""
        self.long = 0
        """keep=True: the length of the returned bytes' first event when it is long (else 0), so
        that a reader can look at its head and tail only and leave the whole to the translator."""

    def feed(self, chunk: bytes) -> bytes:
        if self._cr:
            chunk = b"\r" + chunk
            self._cr = False
        if has(chunk, b"\r"):  # CRLF and lone CR end lines too (the SSE spec); only some engines use them
            if chunk.endswith(b"\r"):
                chunk = chunk[:-1]
                self._cr = True
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        self.scanned += len(chunk)
        if self.passed or self.ended is not None or self.long:
            self.passed, self.ended, self.long = b"", None, 0
        if not self._parts and chunk.endswith(b"\n\n") and len(chunk) <= self.limit:
            return chunk  # the usual read: whole events, nothing held
        end = chunk.rfind(b"\n\n")
        if end >= 0:
            cut = end + 2
        elif self._nl and chunk.startswith(b"\n"):
            cut = 1  # the blank line's first LF ended the held bytes
        else:
            return self._hold(chunk)
        first = 1 if self._nl and chunk.startswith(b"\n") else chunk.find(b"\n\n") + 2
        if self._held + len(chunk) > self.limit:
            self._check(chunk, first, cut)
        rest = chunk[cut:]
        if self._dropped:
            done = self._end_long(chunk, first, cut)
        elif self._parts:
            if self._held + first > LONG:
                self.long = self._held + first
            self._parts.append(chunk[:cut])
            done = b"".join(self._parts)
        else:
            done = chunk[:cut] if rest else chunk
        self._parts = [rest] if rest else []
        self._held = len(rest)
        self._nl = rest.endswith(b"\n")
        return done

    def _hold(self, chunk: bytes) -> bytes:
        if chunk:
            self._held += len(chunk)
            if self._held > self.limit:
                raise EventTooLarge(self.limit)
            self._nl = chunk.endswith(b"\n")
            if self._keep or self._held <= LONG:
                self._parts.append(chunk)
            elif not self._dropped:  # the event just became long: what was held goes out now
                self._parts.append(chunk)
                self.passed = b"".join(self._parts)
                self._parts = [self.passed[:LONG], self.passed[LONG:]]
                self._tail = len(self._parts[1])
                self._dropped = True
            else:
                self.passed = chunk
                self._parts.append(chunk)
                self._tail += len(chunk)
                while len(self._parts) > 2 and self._tail - len(self._parts[1]) >= LONG:
                    self._tail -= len(self._parts[1])  # the middle: neither head nor the last LONG bytes
                    del self._parts[1]
        return b""

    def _end_long(self, chunk: bytes, first: int, cut: int) -> bytes:
        """A long event ends in this read: its last bytes go out, its head and tail are kept for
        reading (`ended`), and the whole events after it are returned."""
        self.passed = chunk[:first]
        tail = b"".join([*self._parts[1:], chunk[:first]])
        self.ended = self._parts[0] + tail[-LONG:]
        self._dropped = False
        self._tail = 0
        return chunk[first:cut]

    def _check(self, chunk: bytes, first: int, cut: int) -> None:
        """The events this read ends, and the bytes after them, against the limit (only when the
        held bytes and the read together exceed it: one more search of this read, never of the held
        bytes)."""
        if self._held + first > self.limit or len(chunk) - cut > self.limit:
            raise EventTooLarge(self.limit)
        start = first
        while len(chunk) - start > self.limit:  # events wholly inside one long read
            stop = chunk.find(b"\n\n", start)
            if stop < 0 or stop + 2 - start > self.limit:
                raise EventTooLarge(self.limit)
            start = stop + 2

    def flush(self) -> bytes:
        """What is held when the stream ends: an event without its blank line (with keep=False a
        long one is out already, and `ended` has its head and tail)."""
        rest = b"\n" if self._cr else b""
        if self._dropped:
            self.ended = self._parts[0] + (b"".join(self._parts[1:]) + rest)[-LONG:]
        else:
            rest = b"".join(self._parts) + rest
        self._parts, self._held, self._tail, self._nl, self._cr, self._dropped = [], 0, 0, False, False, False
        return b"" if self.ended is not None else rest


def last_object(sample: bytes, key: bytes) -> dict[str, Any] | None:
    """The JSON object that follows the last `"key":` in `sample` (the head and tail of a long
    event, not valid JSON as a whole): its usage, read without decoding the event. A quote inside a
    JSON string is escaped, so the marker is never inside a value."""
    marker = b'"' + key + b'":'
    at = sample.rfind(marker)
    if at < 0:
        return None
    text = sample[at + len(marker) :].decode("utf-8", "replace").lstrip()
    try:
        value, _ = json.JSONDecoder().raw_decode(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
