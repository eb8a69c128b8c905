"""The spans' way out: a bounded queue the request path appends to, and one thread that waits for a
span, gathers for the schedule delay (or until a batch is full), encodes the batch (otlp.py) and
POSTs it to the collector over HTTP/1.1 keep-alive. The thread starts with the first span and sleeps
without a timeout while the queue is empty, so a tracer that records nothing never wakes. A full
queue drops the span and counts it, as the SDK's batch processor does."""

from __future__ import annotations

import gzip
import logging
import os
import socket
import ssl
import threading
import zlib
from collections import deque
from urllib.parse import urlsplit

from gateway.tracing import otlp
from gateway.tracing.record import SpanRecord
from gateway.tracing.settings import ExportSettings

log = logging.getLogger("gateway.tracing")


class OtlpHttp:
    """POSTs encoded bodies to one OTLP/HTTP traces URL on a kept-alive connection: a plain blocking
    socket and a minimal HTTP/1.1 exchange (the status line, the length or chunks of the answer,
    nothing else read), as http.client's header parsing cost more than the export it carried."""

    def __init__(self, settings: ExportSettings) -> None:
        self._settings = settings
        url = urlsplit(settings.endpoint)
        self._https = url.scheme == "https"
        self._host = url.hostname or "localhost"
        self._port = url.port or (443 if self._https else 80)
        path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        host = self._host if url.port is None else f"{self._host}:{url.port}"
        lines = [f"POST {path} HTTP/1.1", f"host: {host}", "content-type: application/x-protobuf"]
        if settings.compression != "none":
            lines.append(f"content-encoding: {settings.compression}")
        lines += [f"{k}: {v}" for k, v in settings.headers.items() if "\n" not in k + v and "\r" not in k + v]
        self._prefix = ("\r\n".join(lines) + "\r\ncontent-length: ").encode("latin-1", "replace")
        self._sock: socket.socket | None = None
        self._failures = 0

    def _connect(self) -> socket.socket:
        s = self._settings
        sock = socket.create_connection((self._host, self._port), timeout=s.timeout_s)
        if not self._https:
            return sock
        context = ssl.create_default_context(cafile=s.certificate)
        if s.client_certificate:
            context.load_cert_chain(s.client_certificate, s.client_key)
        return context.wrap_socket(sock, server_hostname=self._host)

    def post(self, body: bytes) -> bool:
        """One export (a second try on a fresh connection if the kept one had closed); False: lost."""
        if self._settings.compression == "gzip":
            body = gzip.compress(body, compresslevel=6)
        elif self._settings.compression == "deflate":
            body = zlib.compress(body)
        message = self._prefix + str(len(body)).encode() + b"\r\n\r\n" + body
        for attempt in (1, 2):
            try:
                if self._sock is None:
                    self._sock = self._connect()
                self._sock.sendall(message)
                status = self._answer(self._sock)
            except (OSError, ValueError) as exc:
                self.close()
                if attempt == 2:
                    return self._failed(f"{type(exc).__name__}: {exc}")
                continue
            if 200 <= status < 300:
                if self._failures:
                    log.info("trace export to %s works again", self._settings.endpoint)
                    self._failures = 0
                return True
            return self._failed(f"HTTP {status}")
        return False

    def _answer(self, sock: socket.socket) -> int:
        """The answer's status, its body read past (by length, chunks, or to the close)."""
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("the collector closed the connection")
            buf += chunk
            if len(buf) > 1 << 16:
                raise ValueError("an answer head over 64 KiB")
        head, _, rest = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        fields = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip().lower()
        if "chunked" in fields.get("transfer-encoding", ""):
            while not rest.endswith(b"0\r\n\r\n"):  # the last chunk and an empty trailer
                chunk = sock.recv(65536)
                if not chunk:
                    raise ConnectionError("the collector closed the connection mid-answer")
                rest += chunk
        elif "content-length" in fields:
            left = int(fields["content-length"]) - len(rest)
            while left > 0:
                chunk = sock.recv(min(left, 65536))
                if not chunk:
                    raise ConnectionError("the collector closed the connection mid-answer")
                left -= len(chunk)
        else:
            fields["connection"] = "close"  # its end is the close
        if fields.get("connection") == "close" or lines[0].startswith("HTTP/1.0"):
            self.close()
        return status

    def _failed(self, why: str) -> bool:
        self._failures += 1
        if self._failures == 1 or self._failures % 100 == 0:  # not a line a batch while a collector is down
            log.warning("trace export to %s failed (%s; %d in a row)", self._settings.endpoint, why, self._failures)
        return False

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class BatchExporter:
    """The queue and its thread. `add` is called on the event loop; everything else on the thread."""

    def __init__(self, settings: ExportSettings, resource: bytes, scope: bytes) -> None:
        self._settings = settings
        self._resource = resource
        self._scope = scope
        self._http = OtlpHttp(settings)
        self._queue: deque[SpanRecord] = deque()
        self._wake = threading.Event()
        self._hurry = threading.Event()
        """A batch is full, or the exporter is closing: export now, not after the delay."""
        self._closing = False
        self._thread: threading.Thread | None = None
        self.dropped = 0
        """Spans dropped because the queue was full."""
        self.exported = 0
        os.register_at_fork(after_in_child=self._forked)

    def add(self, record: SpanRecord) -> None:
        queue = self._queue
        if len(queue) >= self._settings.max_queue:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning("trace export queue full: %d spans dropped", self.dropped)
            return
        queue.append(record)
        if self._thread is None:
            self._start()
        n = len(queue)
        if n == 1:  # the first of a batch: the thread starts its delay
            self._wake.set()
        elif n == self._settings.max_batch:
            self._hurry.set()

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="otlp-export", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        s = self._settings
        while True:
            self._wake.wait()  # no timeout: nothing queued, nothing to do
            self._wake.clear()
            if len(self._queue) < s.max_batch and not self._closing:
                self._hurry.wait(s.delay_s)  # gather a batch; a full one or shutdown cuts it short
            self._hurry.clear()
            self._drain()
            if self._closing:
                return

    def _drain(self) -> None:
        queue, size = self._queue, self._settings.max_batch
        while queue:
            batch = [queue.popleft() for _ in range(min(size, len(queue)))]
            if self._http.post(otlp.request(self._resource, self._scope, batch)):
                self.exported += len(batch)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Export what is queued, then stop the thread."""
        self._closing = True
        thread = self._thread
        if thread is not None:
            self._hurry.set()
            self._wake.set()
            thread.join(timeout_s)
        elif self._queue:
            self._drain()
        self._http.close()

    def _forked(self) -> None:
        """A child process has no thread of its parent's: its own starts with its first span."""
        self._thread = None
        self._queue = deque()
        self._wake = threading.Event()
        self._hurry = threading.Event()
        self._http = OtlpHttp(self._settings)
