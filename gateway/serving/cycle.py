"""The request/response cycle under uvicorn: its httptools RequestResponseCycle with a leaner
`send` and `receive`.

The differences, each measured on the overhead benchmark (docs/benchmarks.md):
- the response head is written together with the first body message, in one `transport.write`
  (uvicorn writes it alone: one more send syscall a request); every response the gateway makes
  sends its first body message right after its start, with no wait between;
- the header checks are two C passes over all the names and all the values (`bytes.translate`)
  instead of two regular-expression searches a header, and only the framing headers are looked at
  one by one;
- the request body is kept as the parser's chunks (`add_body`) and handed over without a copy, and
  `receive` waits on the event only when no body is waiting.
Everything else (framing, Content-Length checks, keep-alive, flow control, 100-continue) is
uvicorn's, line for line. serving/protocol.py makes each request's cycle of this class."""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, RequestResponseCycle

from gateway.asgi import BODY_WRITER, ChunkWriter

# uvicorn's HEADER_RE and HEADER_VALUE_RE, as byte sets: a name is a token, a value has no control
# byte but tab.
_BAD_NAME = bytes(range(0x20)) + b'\x7f()<>@,;:[]={} \t\\"'
_BAD_VALUE = bytes(b for b in range(0x20) if b != 0x09) + b"\x7f"
_FRAMING = frozenset((b"content-length", b"transfer-encoding", b"connection"))
"""The names whose values change how the response is framed or whether the connection stays."""


class GatewayCycle(RequestResponseCycle):
    _head: bytes = b""
    """The encoded response head, until the first body message takes it."""
    _chunks: list[bytes] | tuple[()] = ()
    """The request body received and not yet given to the app, as the parser gave it (uvicorn
    copies each chunk into a bytearray, then the bytearray into bytes)."""
    _size = 0
    _ended = False
    """The message with the body's end has been given to the app: a later receive() waits."""

    def add_body(self, chunk: bytes) -> int:
        """Keep a chunk of the request body; the bytes now waiting for receive()."""
        if self._chunks:
            self._chunks.append(chunk)
        else:
            self._chunks = [chunk]
        self._size += len(chunk)
        return self._size

    async def receive(self) -> Any:
        # uvicorn's, but with no wait on the event when the body is already here (or complete).
        if self.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.waiting_for_100_continue = False
        if not self.disconnected and not self.response_complete:
            self.flow.resume_reading()
            # Nothing to hand over (no chunk waiting, and the body's end already given or not yet
            # here): wait, as uvicorn does, for more body, the disconnect or the response's end.
            if not self._chunks and (self.more_body or self._ended):
                await self.message_event.wait()
            self.message_event.clear()
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        chunks, self._chunks, self._size = self._chunks, (), 0
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._ended = not self.more_body
        return {"type": "http.request", "body": body, "more_body": self.more_body}

    async def send(self, message: Any) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        if not self.response_started:
            if message["type"] != "http.response.start":
                raise RuntimeError(f"Expected ASGI message 'http.response.start', but got '{message['type']}'.")
            self.response_started = True
            self.waiting_for_100_continue = False
            self._head = self._encode_head(message["status"], message.get("headers", ()))
            return
        if self.response_complete:
            raise RuntimeError(f"Unexpected ASGI message '{message['type']}' sent, after response already completed.")
        if message["type"] != "http.response.body":
            raise RuntimeError(f"Expected ASGI message 'http.response.body', but got '{message['type']}'.")
        body: bytes = message.get("body", b"")
        more_body = message.get("more_body", False)
        head, self._head = self._head, b""
        if self.scope["method"] == "HEAD":
            self.expected_content_length = 0
            out = head
        elif self.chunked_encoding:
            out = head + (b"%x\r\n%b\r\n" % (len(body), body) if body else b"")
            if not more_body:
                out += b"0\r\n\r\n"
        else:
            if len(body) > self.expected_content_length:
                raise RuntimeError("Response content longer than Content-Length")
            self.expected_content_length -= len(body)
            out = head + body if head else body
        if out:
            self.transport.write(out)
        if head and more_body and self.chunked_encoding and self.scope["method"] != "HEAD":
            # The head is out, chunked: the rest of the body may go through a ChunkWriter (asgi.BODY_WRITER).
            # It holds the transport and the flow, never the cycle, so the scope makes no cycle.
            self.scope[BODY_WRITER] = ChunkWriter(self.transport, self.flow)  # type: ignore[literal-required]
        if not more_body:
            if self.expected_content_length != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            self.message_event.set()
            if not self.keep_alive:
                self.transport.close()
            self.on_response()

    def _encode_head(self, status: int, given: Any) -> bytes:
        headers = [*self.default_headers, *given]
        names = b"".join([name for name, _ in headers])
        values = b"".join([value for _, value in headers])
        if len(names.translate(None, _BAD_NAME)) != len(names):
            raise RuntimeError("Invalid HTTP header name.")
        if len(values.translate(None, _BAD_VALUE)) != len(values):
            raise RuntimeError("Invalid HTTP header value.")
        if names.lower() != names:  # uvicorn writes every name in lower case; the gateway's are
            headers = [(name.lower(), value) for name, value in headers]
        content = [STATUS_LINE[status]]
        has_connection_close = False
        for name, value in headers:
            if name in _FRAMING:
                if name == b"content-length" and self.chunked_encoding is None:
                    self.expected_content_length = int(value.decode())
                    self.chunked_encoding = False
                elif name == b"transfer-encoding" and value.lower() == b"chunked":
                    self.expected_content_length = 0
                    self.chunked_encoding = True
                elif name == b"connection" and b"close" in [t.lower().strip() for t in value.split(b",")]:
                    self.keep_alive = False
                    has_connection_close = True
            content += (name, b": ", value, b"\r\n")
        if not self.keep_alive and not has_connection_close:
            content.append(b"connection: close\r\n")
        if self.chunked_encoding is None and self.scope["method"] != "HEAD" and status not in (204, 304):
            self.chunked_encoding = True
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        return b"".join(content)
