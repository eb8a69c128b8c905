"""The spans' way out: a bounded queue the request path appends to, and one thread that waits for a
span, gathers for the schedule delay (or until a batch is full), encodes the batch (otlp.py) and
POSTs it to the collector over HTTP/1.1 keep-alive. The thread starts with the first span and sleeps
without a timeout while the queue is empty, so a tracer that records nothing never wakes. A full
queue drops the span and counts it, as the SDK's batch processor does."""

from __future__ import annotations

import gzip
import http.client
import logging
import os
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
    """POSTs encoded bodies to one OTLP/HTTP traces URL on a kept-alive connection."""

    def __init__(self, settings: ExportSettings) -> None:
        self._settings = settings
        url = urlsplit(settings.endpoint)
        self._https = url.scheme == "https"
        self._host = url.hostname or "localhost"
        self._port = url.port or (443 if self._https else 80)
        self._path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        self._headers = {"content-type": "application/x-protobuf", **settings.headers}
        if settings.compression != "none":
            self._headers["content-encoding"] = settings.compression
        self._conn: http.client.HTTPConnection | None = None
        self._failures = 0

    def _connect(self) -> http.client.HTTPConnection:
        s = self._settings
        if not self._https:
            return http.client.HTTPConnection(self._host, self._port, timeout=s.timeout_s)
        context = ssl.create_default_context(cafile=s.certificate)
        if s.client_certificate:
            context.load_cert_chain(s.client_certificate, s.client_key)
        return http.client.HTTPSConnection(self._host, self._port, timeout=s.timeout_s, context=context)

    def post(self, body: bytes) -> bool:
        """One export (a second try on a fresh connection if the kept one had closed); False: lost."""
        if self._settings.compression == "gzip":
            body = gzip.compress(body, compresslevel=6)
        elif self._settings.compression == "deflate":
            body = zlib.compress(body)
        for attempt in (1, 2):
            try:
                if self._conn is None:
                    self._conn = self._connect()
                self._conn.request("POST", self._path, body, self._headers)
                resp = self._conn.getresponse()
                resp.read()
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                if attempt == 2:
                    return self._failed(f"{type(exc).__name__}: {exc}")
                continue
            if 200 <= resp.status < 300:
                if self._failures:
                    log.info("trace export to %s works again", self._settings.endpoint)
                    self._failures = 0
                return True
            return self._failed(f"HTTP {resp.status}")
        return False

    def _failed(self, why: str) -> bool:
        self._failures += 1
        if self._failures == 1 or self._failures % 100 == 0:  # not a line a batch while a collector is down
            log.warning("trace export to %s failed (%s; %d in a row)", self._settings.endpoint, why, self._failures)
        return False

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


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
