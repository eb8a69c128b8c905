"""The simulator engine (``sim``): an OpenAI-compatible HTTP/1.1 server on raw asyncio streams that imitates
vLLM, SGLang or llama.cpp (shapes, metrics, errors), models continuous batching, and misbehaves on request.

It is a test and demo tool, never presented as a real engine. See DESIGN.md, "The simulator engine".
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from engines.sim import responses
from engines.sim.api import PROBE_PATHS, Killed, SimApi
from engines.sim.completions import completion
from engines.sim.engine import SimEngine
from engines.sim.faults import FAULT_HEADER, Fault, FaultSpecError, parse_fault
from engines.sim.http import BadRequest, ClientGone, HttpConn, HttpRequest
from engines.sim.messages import MessagesApi
from engines.sim.model import BatchCore, SimParams

__all__ = ["FAULT_HEADER", "RequestRecord", "SimParams", "SimServer", "SimStats", "run_sim"]

logger = logging.getLogger(__name__)


@dataclass
class RequestRecord:
    """What reached the simulator, and how it ended: ``outcome`` is active, completed (the whole
    response was sent), aborted (the client left first), killed (the die fault), cancelled (stop) or
    error (a bug in the simulator; logged)."""

    id: int
    method: str
    path: str
    headers: dict[str, str]
    body: Any  # the parsed JSON, or the raw text when it is not JSON
    started: float = field(default_factory=time.monotonic)
    outcome: str = "active"
    disconnected_at: float | None = None  # monotonic time the client was seen to leave
    finished_at: float | None = None
    writes: int = 0  # socket writes made for the response (the split fault makes one per piece)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "method": self.method,
            "path": self.path,
            "headers": self.headers,
            "body": self.body,
            "outcome": self.outcome,
            "started": self.started,
            "disconnected_at": self.disconnected_at,
            "finished_at": self.finished_at,
            "writes": self.writes,
        }


@dataclass
class SimStats:
    """Live counters of one server (probes and /sim/* excluded); ``waiting``/``running`` read the model."""

    core: BatchCore = field(repr=False)
    seen: int = 0
    active: int = 0
    aborted: int = 0
    completed: int = 0
    killed: int = 0
    recent: deque[RequestRecord] = field(default_factory=lambda: deque(maxlen=256))

    @property
    def waiting(self) -> int:
        return len(self.core.waiting)

    @property
    def running(self) -> int:
        return len(self.core.running)

    def to_json(self) -> dict[str, int]:
        return {
            "seen": self.seen,
            "active": self.active,
            "aborted": self.aborted,
            "completed": self.completed,
            "killed": self.killed,
            "waiting": self.waiting,
            "running": self.running,
        }


class SimServer:
    """One simulated backend on ``host:port`` (port 0 picks a free one); use ``async with``."""

    def __init__(self, params: SimParams, host: str = "127.0.0.1", port: int = 0) -> None:
        self.params = params
        self.host = host
        self.port = port
        self.engine = SimEngine(params)
        self.api = SimApi(self.engine)
        self.api.routes[("POST", "/v1/chat/completions")] = functools.partial(completion, self.api, chat=True)
        self.api.routes[("POST", "/v1/completions")] = functools.partial(completion, self.api, chat=False)
        messages = MessagesApi(self.api)
        self.api.routes[("POST", "/v1/messages")] = messages.messages
        self.api.routes[("POST", "/v1/messages/count_tokens")] = messages.count_tokens
        if params.flavour in ("vllm", "sglang"):  # the engines that serve the Responses API themselves
            self.responses = responses.ResponseStore()
            for method, path, handler in (
                ("POST", "/v1/responses", responses.create),
                ("GET", "/v1/responses/{id}", responses.retrieve),
                ("POST", "/v1/responses/{id}/cancel", responses.cancel),
            ):
                self.api.routes[(method, path)] = functools.partial(handler, self.api, self.responses)
        self.stats = SimStats(core=self.engine.core)
        self._fault = parse_fault(params.fault)  # raises FaultSpecError (a ValueError) early
        self._probe_fault = Fault()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._ids = itertools.count(1)
        self._changed = asyncio.Event()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> int:
        self.engine.start()
        self._server = await asyncio.start_server(self._on_connection, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        await self.engine.stop()

    async def __aenter__(self) -> SimServer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    def set_fault(self, fault: str | None = None, probe_fault: str | None = None) -> None:
        """Change the server-wide fault (inference endpoints) and/or the one for probe paths at runtime."""
        if fault is not None:
            self._fault = parse_fault(fault)
        if probe_fault is not None:
            self._probe_fault = parse_fault(probe_fault)

    async def wait_until(self, predicate: Callable[[SimStats], bool], timeout: float = 5.0) -> None:
        """Wait until ``predicate(stats)`` holds; raises TimeoutError after ``timeout`` seconds."""
        async with asyncio.timeout(timeout):
            while not predicate(self.stats):
                # Counters notify; the model's waiting/running do not, hence the short poll as well.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), 0.01)

    def _notify(self) -> None:
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        conn = HttpConn(reader, writer)
        try:
            while True:
                try:
                    req = await conn.read_request()
                except BadRequest as exc:
                    conn.close_after = True
                    await self.api.send_error(conn, Fault(), exc.status, str(exc))
                    break
                if req is None or not await self._handle(conn, req):
                    break
        except (ClientGone, Killed, ConnectionError):
            pass
        except Exception:
            logger.exception("sim: unexpected error; closing the connection")
        except asyncio.CancelledError:
            # stop() cancels us. asyncio's start_server callback calls task.exception() on this task and
            # logs a spurious error if it ends cancelled, so end it normally instead.
            pass
        finally:
            with contextlib.suppress(asyncio.CancelledError):  # stop() may cancel us while closing, too
                await conn.close()
            self._tasks.discard(task)

    async def _handle(self, conn: HttpConn, req: HttpRequest) -> bool:
        """Answer one request; True when the connection may carry another."""
        conn.close_after = not req.keep_alive
        if req.path.startswith("/sim/"):
            await self._control(conn, req)
            return not conn.close_after
        probe = req.path in PROBE_PATHS
        record = None if probe else self._record(req)
        conn.watch()
        outcome = "error"  # until proven otherwise; an unexpected exception keeps it
        try:
            try:
                fault = parse_fault(req.headers.get(FAULT_HEADER, ""), self._probe_fault if probe else self._fault)
            except FaultSpecError as exc:
                await self.api.send_error(conn, Fault(), 400, f"{FAULT_HEADER}: {exc}")
                outcome = "completed"
                return not conn.close_after
            conn.split = fault.split
            await self._respond(conn, req, fault)
            outcome = "completed"
        except ClientGone:
            outcome = "aborted"
        except Killed:
            outcome = "killed"
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            conn.split = 0
            await conn.unwatch()
            if record is not None:
                self._finish(record, outcome, conn)
        return outcome == "completed" and not conn.close_after

    async def _respond(self, conn: HttpConn, req: HttpRequest, fault: Fault) -> None:
        if fault.never:
            await conn.gone.wait()
            raise ClientGone
        await conn.sleep(fault.headers_delay)
        if fault.die_after == -1:
            await conn.kill(fault.die == "rst")
            raise Killed
        if fault.status is not None:
            await self.api.send_status_fault(conn, fault)
        else:
            await self.api.route(conn, req, fault)

    def _record(self, req: HttpRequest) -> RequestRecord:
        try:
            body: Any = json.loads(req.body) if req.body else None
        except (ValueError, UnicodeDecodeError):
            body = req.body.decode("utf-8", "replace")
        record = RequestRecord(next(self._ids), req.method, req.path, dict(req.headers), body)
        self.stats.recent.append(record)
        self.stats.seen += 1
        self.stats.active += 1
        self._notify()
        return record

    def _finish(self, record: RequestRecord, outcome: str, conn: HttpConn) -> None:
        record.outcome = outcome
        record.finished_at = time.monotonic()
        record.disconnected_at = conn.gone_at
        record.writes = conn.writes
        self.stats.active -= 1
        if outcome in ("completed", "aborted", "killed"):
            setattr(self.stats, outcome, getattr(self.stats, outcome) + 1)
        self._notify()

    async def _control(self, conn: HttpConn, req: HttpRequest) -> None:
        """``GET /sim/stats``, ``GET /sim/requests``, ``POST /sim/reset`` ({"cache": true} also empties the
        prefix cache) and ``POST /sim/fault`` ({"fault": spec, "probe_fault": spec})."""
        body = self.api.parse_body(req) if req.body else {}
        none = Fault()
        if isinstance(body, tuple):
            await self.api.send_json(conn, none, *body)
        elif (req.method, req.path) == ("GET", "/sim/stats"):
            await self.api.send_json(conn, none, 200, self.stats.to_json())
        elif (req.method, req.path) == ("GET", "/sim/requests"):
            await self.api.send_json(conn, none, 200, [r.to_json() for r in self.stats.recent])
        elif (req.method, req.path) == ("POST", "/sim/reset"):
            self.stats.seen = self.stats.aborted = self.stats.completed = self.stats.killed = 0
            self.stats.recent.clear()
            if body.get("cache"):
                self.engine.core.cache.clear()
            await self.api.send_json(conn, none, 200, self.stats.to_json())
        elif (req.method, req.path) == ("POST", "/sim/fault"):
            try:
                self.set_fault(body.get("fault"), body.get("probe_fault"))
            except FaultSpecError as exc:
                await self.api.send_error(conn, none, 400, str(exc))
                return
            await self.api.send_json(conn, none, 200, {"ok": True})
        else:
            await self.api.send_json(conn, none, *self.api.flavour.not_found())


async def run_sim(params: SimParams, host: str, port: int, banner: str = "") -> None:
    """Serve until cancelled (``gateway sim``); print ``banner`` once listening."""
    async with SimServer(params, host, port) as server:
        if banner:
            print(banner, flush=True)
        logger.info("sim (%s flavour, model %s) listening on %s", params.flavour, params.model, server.base_url)
        await asyncio.Event().wait()
