"""The skeleton both translators of a chat completions stream share (Messages and Responses): the
upstream's bytes split into events, [DONE], the engine's error event, the usage and the first
choice handed to the protocol's own hooks, and one ending, whichever way the stream stops. Pure."""

from __future__ import annotations

from typing import Any

from gateway.protocols.frames import DataFrames, decode_event, is_done

UNFINISHED = "The backend's stream ended before it finished."


class ChatStreamTranslation:
    """Feed it the upstream's raw bytes as they come; it returns the client protocol's SSE bytes to
    send (often none). ``finish()`` when the upstream ends closes a stream that lacked [DONE], or
    fails it if no finish_reason came. A protocol fills in the hooks: ``_start`` (the first event),
    ``_choice`` (each event's first choice), ``_close`` (the normal end), ``_fail`` (a stream that
    ended unfinished) and ``_error`` (the engine's own error event)."""

    def __init__(self) -> None:
        self._frames = DataFrames()
        self._started = False
        self._ended = False
        self._finish: Any = None
        self._usage: dict[str, Any] | None = None

    def feed(self, chunk: bytes) -> bytes:
        return b"".join(self._payload(p) for p in self._frames.feed(chunk))

    def finish(self) -> bytes:
        out = b"".join(self._payload(p) for p in self._frames.flush())
        if self._ended:
            return out
        if self._finish is None:
            return out + self._fail(UNFINISHED)
        return out + self._close()

    def _payload(self, payload: bytes) -> bytes:
        if self._ended:
            return b""
        if is_done(payload):
            return self._close()
        event = decode_event(payload)
        if event is None:
            return b""
        if "error" in event and "choices" not in event:
            return self._error(event["error"])
        out = b"" if self._started else self._start(event)
        if isinstance(event.get("usage"), dict):
            self._usage = event["usage"]
        choices = event.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            out += self._choice(choices[0])
        return out

    def _start(self, event: dict[str, Any]) -> bytes:
        """The protocol's opening events; sets ``_started``."""
        raise NotImplementedError

    def _choice(self, choice: dict[str, Any]) -> bytes:
        raise NotImplementedError

    def _close(self) -> bytes:
        """The normal end (opening first, if nothing came); sets ``_ended``."""
        raise NotImplementedError

    def _fail(self, message: str) -> bytes:
        """The end of a stream that stopped unfinished; sets ``_ended``."""
        raise NotImplementedError

    def _error(self, inner: Any) -> bytes:
        """The end when the engine sent an error event in place of chunks; sets ``_ended``."""
        raise NotImplementedError


def error_message(inner: Any) -> str:
    """The message of an engine's error event (an object with a message, or a bare value)."""
    message = inner.get("message") if isinstance(inner, dict) else inner
    return str(message or "The backend failed.")
