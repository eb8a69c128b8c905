"""The HTTP protocol under uvicorn: its httptools protocol plus a deadline for receiving a whole
request (headers and body), so that a slowloris client (a header byte every few seconds) cannot
hold a connection for ever, and bounds on the request head (its bytes and its header count),
which uvicorn sets for h11 but not for httptools. It also stamps each request's arrival in its
scope (`ARRIVED`), where the endpoint starts the request's clock, and gives it the connection's
disconnect hook (`CLIENT_GONE`) and its loop (`LOOP`; the cycle adds `BODY_WRITER`; gateway/asgi.py
says what each is for). The request-side parser callbacks are uvicorn's with these
additions folded in (one call each, not an override and a super() call), and they make the
gateway's cycle (serving/cycle.py) directly: 12.5 -> 10.4 us a request in the protocol alone."""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from typing import Any

import httptools
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT, service_unavailable
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.asgi import ARRIVED, CLIENT_GONE, LOOP, ClientGone
from gateway.deadlines import Deadlines
from gateway.errors import HeaderTooLarge
from gateway.serving.cycle import GatewayCycle


class _HeadRefused(Exception):
    """Raised inside a parser callback to stop parsing; the protocol then answers 431."""


def protocol_class(
    request_timeout_s: float, max_header_bytes: int = 64 * 1024, max_headers: int = 100
) -> type[HttpToolsProtocol]:
    """A protocol class with this deadline and these head limits, for uvicorn.Config(http=...)."""
    idle = Deadlines()  # the keep-alive limit of every idle connection of this server, on one timer

    class GatewayProtocol(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None
        _in_head = True
        _head_bytes = 0
        _header_count = 0
        _refusal: str | None = None
        _linger: asyncio.TimerHandle | None = None
        _discard_left = 0
        _receiving = False
        _gone: ClientGone | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._gone = ClientGone()
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._refusal is not None:  # refused: drop what the client still sends, a while
                self._discard_left -= len(data)
                if self._discard_left < 0:
                    self.transport.pause_reading()  # then wait, without reading, for the close
                return
            # Count head bytes before the parser sees them: httptools builds a header value by
            # repeated concatenation, so a 128 MB header must be cut here, not in a callback.
            while data and self._refusal is None:
                if not self._in_head:
                    super().data_received(data)
                    break
                room = max_header_bytes - self._head_bytes
                part, data = data[: max(room, 0)], data[max(room, 0) :]
                self._head_bytes += len(part)
                if part:
                    super().data_received(part)
                if data and self._in_head and self._refusal is None:
                    self._refuse(f"The request head is larger than the {max_header_bytes}-byte limit.")
            if self._receiving and self._refusal is None:
                self._arm()  # the request goes on past this read: now it needs its deadline

        def on_message_begin(self) -> None:
            # uvicorn's, in one call: the scope, with the request's arrival stamped for its clock
            # (TTFT, duration): its first byte parsed, not the moment its task first runs, which
            # under load waits behind other streams' relays.
            idle.discard(self)  # a request begins: not idle (bytes alone, a stray CRLF, are not one)
            self.url = b""
            self.expect_100_continue = False
            self.headers = []
            scope: dict[str, Any] = {
                "type": "http",
                "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
                "http_version": "1.1",
                "server": self.server,
                "client": self.client,
                "scheme": self.scheme,
                "root_path": self.root_path,
                "headers": self.headers,
                "state": self.app_state.copy(),
                ARRIVED: time.perf_counter(),
                CLIENT_GONE: self._gone,
                LOOP: self.loop,
            }
            self.scope = scope  # type: ignore[assignment]
            self._header_count = 0
            # The next request on a kept-alive connection. Its deadline is armed at the end of the
            # read only if it is still incomplete there: most requests arrive in one read, and a
            # timer armed and cancelled in the same call cost ~2.4 us a request.
            self._receiving = True

        def on_header(self, name: bytes, value: bytes) -> None:
            self._header_count += 1
            if self._header_count > max_headers:
                self._refusal = f"The request has more than {max_headers} header fields."
                raise _HeadRefused  # httptools stops parsing; uvicorn calls send_400_response
            name = name.lower()
            # llhttp keeps trailing whitespace, which RFC 9110 5.5 excludes from the value (uvicorn 0.55's fix)
            value = value.rstrip(b" \t")
            if name == b"expect" and value.lower() == b"100-continue":
                self.expect_100_continue = True
            self.headers.append((name, value))

        def on_headers_complete(self) -> None:
            # uvicorn's, making the gateway's cycle (serving/cycle.py) and a request body store
            # without a copy (on_body).
            self._in_head = False
            parser = self.parser
            http_version = parser.get_http_version()
            scope = self.scope
            scope["method"] = parser.get_method().decode("ascii")
            if http_version != "1.1":
                scope["http_version"] = http_version
            if parser.should_upgrade() and self._should_upgrade():
                return
            parsed_url = httptools.parse_url(self.url)
            raw_path = parsed_url.path
            path = raw_path.decode("ascii")
            if "%" in path:
                path = urllib.parse.unquote(path)
            scope["path"] = self.root_path + path
            scope["raw_path"] = self.root_path.encode("ascii") + raw_path
            scope["query_string"] = parsed_url.query or b""
            app = self.app
            if self.limit_concurrency is not None and (
                len(self.connections) >= self.limit_concurrency or len(self.tasks) >= self.limit_concurrency
            ):
                app = service_unavailable
                self.logger.warning("Exceeded concurrency limit.")
            existing = self.cycle
            self.cycle = GatewayCycle(
                scope=scope,
                transport=self.transport,
                flow=self.flow,
                logger=self.logger,
                access_logger=self.access_logger,
                access_log=self.access_log,
                default_headers=self.server_state.default_headers,
                message_event=asyncio.Event(),
                expect_100_continue=self.expect_100_continue,
                keep_alive=http_version != "1.0" and parser.should_keep_alive(),
                on_response=self.on_response_complete,
            )
            if existing is None or existing.response_complete:
                self._start_asgi_task(self.cycle, app)
            else:  # pipelined: queued, as uvicorn does
                self.flow.pause_reading()
                self.pipeline.appendleft((self.cycle, app))

        def on_body(self, body: bytes) -> None:
            if (self.parser.should_upgrade() and self._should_upgrade()) or self.cycle.response_complete:
                return
            cycle = self.cycle
            assert isinstance(cycle, GatewayCycle)
            if cycle.add_body(body) > HIGH_WATER_LIMIT:
                self.flow.pause_reading()
            cycle.message_event.set()

        def on_message_complete(self) -> None:
            self._receiving = False
            self._disarm()
            self._in_head, self._head_bytes = True, 0
            if not (self.parser.should_upgrade() and self._should_upgrade()) and not self.cycle.response_complete:
                self.cycle.more_body = False
                self.cycle.message_event.set()
            # uvicorn stops reading past 64 KiB of unread body and reads again only in receive();
            # the gateway does not call receive() once it has the body (the disconnect hook
            # replaced that listener), so read again here, or a client's close after a large
            # body would never be seen. A pipelined request that comes is queued, as uvicorn does.
            self.flow.resume_reading()

        def send_400_response(self, msg: str) -> None:
            if self._refusal is not None:
                self._send_431(self._refusal)
            else:
                super().send_400_response(msg)

        def on_response_complete(self) -> None:
            """uvicorn's, but the keep-alive limit is a deadline on the server's one timer, not
            a call_later (and its cancel on the next request) a response."""
            self.server_state.total_requests += 1
            if self.transport.is_closing():
                return
            self._unset_keepalive_if_required()
            self.flow.resume_reading()
            if self.pipeline:
                cycle, app = self.pipeline.pop()
                self._start_asgi_task(cycle, app)
            else:
                idle.add(self, self.timeout_keep_alive, self.timeout_keep_alive_handler, self.loop)

        def connection_lost(self, exc: Exception | None) -> None:
            idle.discard(self)
            self._disarm()
            if self._linger is not None:
                self._linger.cancel()
            cycle = self.cycle
            super().connection_lost(exc)
            if self._gone is not None:
                self._gone.lost(cycle is not None and not cycle.response_complete)

        def _refuse(self, message: str) -> None:
            self._refusal = message
            self._send_431(message)

        def _send_431(self, message: str) -> None:
            """431 with an OpenAI-shaped body, then close; if a response is still being written
            on this connection (pipelining), close without one rather than interleave. The close
            lingers 1 s (reading and dropping up to 1 MiB more, then not reading at all), so that a
            client still writing its head gets to read the 431 before the reset."""
            self._disarm()
            if self.transport.is_closing():
                return
            if self.cycle is None or self.cycle.response_complete:
                err = HeaderTooLarge(message)
                body = err.body_bytes()
                head = (
                    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                    b"content-type: application/json\r\n"
                    b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n"
                )
                self.transport.write(head + body)
                if self.transport.can_write_eof():
                    self.transport.write_eof()
                    self._discard_left = 1 << 20
                    self._linger = self.loop.call_later(1.0, self.transport.close)
                    return
            self.transport.close()

        def _arm(self) -> None:
            if self._deadline is None and request_timeout_s > 0:
                self._deadline = self.loop.call_later(request_timeout_s, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                self.transport.close()

    return GatewayProtocol
