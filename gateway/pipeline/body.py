"""The request body from the ASGI receive channel, up to the configured limit: a declared
Content-Length over it is refused before a byte is read, a body that grows past it is refused
once it does (after draining up to a MiB more, so that the client can read the 413)."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from gateway.asgi import Receive
from gateway.errors import InvalidRequest, PayloadTooLarge


async def read_body(receive: Receive, headers: dict[str, str], limit: int) -> bytes | None:
    """The whole body; None when the client left before sending it."""
    declared = headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise InvalidRequest("Content-Length is not a number.", code="invalid_header")
        if int(declared) > limit:
            raise PayloadTooLarge(f"The request body is larger than the {limit}-byte limit.")
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                await _discard(receive, message, 1 << 20)
                raise PayloadTooLarge(f"The request body is larger than the {limit}-byte limit.")
            parts.append(chunk)
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


async def _discard(receive: Receive, message: MutableMapping[str, Any], budget: int) -> None:
    """Read and drop up to `budget` more bytes of an oversized body, so that a client which
    writes its whole body before reading can still read the 413 (else it sees a reset)."""
    while message.get("more_body", False) and budget > 0:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        budget -= len(message.get("body", b""))
