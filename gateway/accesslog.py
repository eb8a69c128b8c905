"""The access log's sink: one line per request, formatted once with an f-string and written out in
batches (one write per second or per 256 lines), not one LogRecord, format and flushed write each."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TextIO

_NAME = "gateway.access"
_MAX_LINES = 256


class AccessLogHandler(logging.Handler):
    """The `gateway.access` logger's handler when the gateway configures logging itself (the CLI).
    `line()` skips the LogRecord machinery; a line waits at most `flush_s` before it is written."""

    def __init__(self, stream: TextIO, flush_s: float = 1.0) -> None:
        super().__init__()
        self.stream = stream
        self.flush_s = flush_s
        self._lines: list[str] = []
        self._second = -1
        self._stamp = ""

    def line(self, message: str) -> None:
        now = time.time()
        second = int(now)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
        self._add(f"{self._stamp},{int((now - second) * 1000):03d} INFO {_NAME} {message}\n")

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._add(self.format(record) + "\n")
        except Exception:  # logging's contract: a handler never raises into the caller
            self.handleError(record)

    def _add(self, text: str) -> None:
        lines = self._lines
        lines.append(text)
        if len(lines) >= _MAX_LINES:
            self.flush()
        elif len(lines) == 1:
            try:
                asyncio.get_running_loop().call_later(self.flush_s, self.flush)
            except RuntimeError:  # no event loop: nothing would flush later
                self.flush()

    def flush(self) -> None:
        if not self._lines:
            return
        text, self._lines = "".join(self._lines), []
        self.acquire()
        try:
            self.stream.write(text)
            self.stream.flush()
        finally:
            self.release()


def install(stream: TextIO, fmt: str) -> None:
    """Give `gateway.access` its batching handler (once), with the rest of the log's format."""
    logger = logging.getLogger(_NAME)
    if not any(isinstance(h, AccessLogHandler) for h in logger.handlers):
        handler = AccessLogHandler(stream)
        handler.setFormatter(logging.Formatter(fmt))
        logger.addHandler(handler)
        logger.propagate = False


def write(logger: logging.Logger, message: str) -> None:
    """One access line: straight into the batching handler when it is the logger's only one;
    otherwise through logging as usual (a library user's own logging config, pytest's caplog)."""
    handlers = logger.handlers
    if len(handlers) == 1 and type(handlers[0]) is AccessLogHandler and not logger.propagate:
        handlers[0].line(message)
    else:
        logger.info(message)
