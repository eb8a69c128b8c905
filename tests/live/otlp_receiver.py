"""A real OTLP/HTTP trace receiver for the tests: an HTTP server on an ephemeral port that decodes each
POST /v1/traces body with opentelemetry-proto's ExportTraceServiceRequest (protobuf, gzip or not) and
keeps the spans, flattened. It runs in a thread of its own, so the gateway's loop, a gateway thread and
an engine process can all export to it."""

from __future__ import annotations

import asyncio
import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

SERVER, CLIENT, INTERNAL = 2, 3, 1
"""opentelemetry-proto's Span.SpanKind numbers."""
STATUS_ERROR = 2


@dataclass
class ReceivedSpan:
    service: str
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    status: int
    status_message: str
    start_ns: int
    end_ns: int

    def event(self, name: str) -> dict[str, Any] | None:
        return next((attrs for n, attrs in self.events if n == name), None)


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, which) if which else None


def _attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


@dataclass
class OtlpReceiver:
    spans: list[ReceivedSpan] = field(default_factory=list)
    posts: int = 0
    headers: list[dict[str, str]] = field(default_factory=list)
    """Each POST's headers (names lower-cased), in arrival order."""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        """The base URL an OTLP/HTTP exporter is given (it appends /v1/traces)."""
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> OtlpReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                with receiver._lock:
                    receiver.headers.append({k.lower(): v for k, v in self.headers.items()})
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces" or "protobuf" not in self.headers.get("content-type", ""):
                    self.send_response(415 if self.path == "/v1/traces" else 404)
                    self.end_headers()
                    return
                receiver.take(body)
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        found: list[ReceivedSpan] = []
        for rs in request.resource_spans:
            service = str(_attributes(rs.resource.attributes).get("service.name", ""))
            for ss in rs.scope_spans:
                for s in ss.spans:
                    found.append(
                        ReceivedSpan(
                            service=service,
                            name=s.name,
                            kind=s.kind,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex(),
                            attributes=_attributes(s.attributes),
                            events=[(e.name, _attributes(e.attributes)) for e in s.events],
                            status=s.status.code,
                            status_message=s.status.message,
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                        )
                    )
        with self._lock:
            self.posts += 1
            self.spans.extend(found)

    def snapshot(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)

    def clear(self) -> None:
        with self._lock:
            self.spans.clear()

    async def wait(self, ready: Callable[[list[ReceivedSpan]], bool], timeout: float = 10.0) -> list[ReceivedSpan]:
        """The spans once `ready` holds for them (polled: the exporter sends from its own thread)."""
        async with asyncio.timeout(timeout):
            while not ready(spans := self.snapshot()):
                await asyncio.sleep(0.02)
        return spans

    def wait_blocking(self, ready: Callable[[list[ReceivedSpan]], bool], timeout: float = 60.0) -> list[ReceivedSpan]:
        deadline = time.monotonic() + timeout
        while not ready(spans := self.snapshot()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"spans never became ready; have {[(s.service, s.name) for s in spans]}")
            time.sleep(0.05)
        return spans
