"""Fault knobs of the simulator: the ``key=value;key=value`` grammar of ``x-sim-fault`` and SimParams.fault.

A request's header is applied on top of the server's default spec, key by key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

FAULT_HEADER = "x-sim-fault"

_FLOATS = ("headers_delay", "first_token_delay", "chunk_delay", "retry_after")
_INTS = ("stall_after", "die_after", "status", "split", "tokens", "huge_event")
_FLAGS = ("first_event_error", "never", "garbage", "client_error", "empty_stream", "short_body")
_CHOICES: dict[str, tuple[str, ...]] = {"die": ("fin", "rst"), "body": ("json", "html", "truncated", "empty")}


class FaultSpecError(ValueError):
    """A fault spec that does not parse; the message names the offending key."""


@dataclass(frozen=True)
class Fault:
    """One request's faults. Defaults mean "behave".

    - ``headers_delay``: seconds to wait before the status line.
    - ``first_token_delay`` / ``chunk_delay``: seconds before the first / each later content chunk.
    - ``stall_after=K``: after K content chunks send nothing more, keep the connection open.
    - ``die_after=K`` with ``die=fin|rst``: after K content chunks close the socket (FIN) or reset it
      (RST, SO_LINGER 0). ``-1`` dies before the status line. Non-streaming responses die before it too.
    - ``status=N`` with ``body=json|html|truncated|empty``: answer N at once (json: the flavour's error).
    - ``retry_after=S``: add ``Retry-After: S`` to the response head.
    - ``first_event_error=1``: a 200 event stream whose first event is an error.
    - ``split=N``: write everything in N-byte pieces; output then includes " café" (a 2-byte character).
    - ``never=1``: read the request, never answer.
    - ``garbage=1``: an SSE line without ``data:`` and a ``data:`` line of invalid JSON before the content.
    - ``tokens=N``: generate N tokens (finish_reason "stop"), unless max_tokens is lower.
    - ``client_error=1`` with ``status=N``: the error's message is llama.cpp's for a client mistake it
      answers with a 500 (a number out of range), so that the adapter, not the status, must judge it.
    - ``empty_stream=1``: a 200 event stream that ends cleanly (the last chunk) without any event.
    - ``short_body=1``: a non-stream 200 whose body stops half-way (Content-Length says more), then FIN.
    - ``huge_event=N``: a chat or completions stream's first content event carries N bytes of text:
      one ``data:`` line of N bytes and more, with no line end until its end (a hostile engine).
      With ``split=1`` and ``chunk_delay`` a stream drips one byte a write instead.
    """

    headers_delay: float = 0.0
    first_token_delay: float = 0.0
    chunk_delay: float = 0.0
    stall_after: int | None = None
    die_after: int | None = None
    die: Literal["fin", "rst"] = "fin"
    status: int | None = None
    body: Literal["json", "html", "truncated", "empty"] = "json"
    retry_after: float | None = None
    first_event_error: bool = False
    split: int = 0
    never: bool = False
    garbage: bool = False
    tokens: int | None = None
    client_error: bool = False
    empty_stream: bool = False
    short_body: bool = False
    huge_event: int = 0

    @property
    def accented(self) -> bool:
        """Whether output text includes multi-byte characters (so that splits can cut inside one)."""
        return self.split > 0

    @property
    def retry_after_header(self) -> str | None:
        if self.retry_after is None:
            return None
        return str(int(self.retry_after)) if self.retry_after == int(self.retry_after) else str(self.retry_after)


def parse_fault(spec: str, base: Fault | None = None) -> Fault:
    """Parse ``spec`` and apply it over ``base`` (default: no faults). Raises FaultSpecError."""
    changes: dict[str, Any] = {}
    for item in spec.split(";"):
        item = item.strip()
        if not item:
            continue
        key, sep, raw = (part.strip() for part in item.partition("="))
        if not sep:
            raise FaultSpecError(f"fault {item!r}: expected key=value")
        changes[key] = _convert(key, raw)
    return dataclasses.replace(base or Fault(), **changes)


def _convert(key: str, raw: str) -> Any:
    if key not in (*_FLOATS, *_INTS, *_FLAGS, *_CHOICES):
        raise FaultSpecError(f"unknown fault key {key!r}")
    try:
        if key in _FLOATS:
            value: Any = float(raw)
            if not value >= 0:  # also rejects NaN
                raise ValueError
        elif key in _INTS:
            value = int(raw)
            low = {"die_after": -1, "status": 200, "split": 1, "tokens": 1}.get(key, 0)
            if value < low or (key == "status" and value > 599):
                raise ValueError
        elif key in _FLAGS:
            if raw not in ("0", "1", "true", "false"):
                raise ValueError
            value = raw in ("1", "true")
        else:
            if raw not in _CHOICES[key]:
                raise ValueError
            value = raw
    except ValueError:
        raise FaultSpecError(f"fault {key}={raw!r}: bad value") from None
    return value
