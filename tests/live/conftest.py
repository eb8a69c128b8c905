"""The live tier: a real uvicorn server running the gateway, in front of simulated engines, over
real loopback sockets. Each test builds its own stack; teardown checks the global invariants."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, get_args

import pytest
import uvicorn

from engines.sim.server import SimParams, SimServer
from gateway.app.instance import Gateway
from gateway.config_loader import parse_config
from gateway.pipeline.exchange import Outcome
from gateway.serving.server import start
from tests.live.redis_server import RedisServer, start_redis


@dataclass
class Stack:
    base_url: str
    sims: dict[str, SimServer]
    gateway: Gateway
    server: uvicorn.Server
    task: asyncio.Task[None]
    logs: list[str] = field(default_factory=list)

    def metric(self, name: str, **labels: str) -> float:
        value = self.gateway.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    def samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        out = []
        for family in self.gateway.metrics.registry.collect():
            for s in family.samples:
                if s.name == name:
                    out.append((dict(s.labels), s.value))
        return out

    def total(self, name: str, **labels: str) -> float:
        return sum(v for lab, v in self.samples(name) if all(lab.get(k) == x for k, x in labels.items()))

    async def wait_metric(self, name: str, value: float, timeout: float = 3.0, **labels: str) -> None:
        async with asyncio.timeout(timeout):
            while self.total(name, **labels) < value:
                await asyncio.sleep(0.005)


def sim_params(flavour: str = "vllm", **overrides: Any) -> SimParams:
    return SimParams.preset("fast", flavour=flavour, **overrides)


StackFactory = Callable[..., Awaitable[Stack]]


@pytest.fixture
async def make_stack() -> AsyncIterator[StackFactory]:
    stacks: list[Stack] = []

    async def factory(
        pools: dict[str, list[SimParams | str]] | None = None,
        routes: list[dict[str, Any]] | None = None,
        platform: str = "nvidia_gpu",
        **sections: Any,
    ) -> Stack:
        pools = pools if pools is not None else {"vllm": [sim_params()]}
        sims: dict[str, SimServer] = {}
        pool_cfg: dict[str, Any] = {}
        for pool, members in pools.items():
            backends = []
            engine = "sim"
            for i, member in enumerate(members):
                name = f"{pool}-{i}"
                if isinstance(member, str):  # a raw URL (e.g. a closed port)
                    backends.append({"url": member, "name": name})
                    continue
                sim = SimServer(member)
                await sim.start()
                sims[name] = sim
                backends.append({"url": sim.base_url, "name": name, "model": member.model})
            extra = sections.pop(f"pool_{pool}", {})
            flavours = {m.flavour for m in members if isinstance(m, SimParams)} or {"vllm"}
            pool_cfg[pool] = {"engine": engine, "flavour": flavours.pop(), "backends": backends, **extra}
        routes = routes or [{"model": "tiny", "pools": list(pools)}]
        data = {
            "pools": pool_cfg,
            "routes": routes,
            "health": {"interval_s": 60, "scrape_interval_s": 60, **sections.pop("health", {})},
            **sections,
        }
        config = parse_config(data, env={})
        running = await start(config, platform=platform)  # type: ignore[arg-type]
        stack = Stack(running.base_url, sims, running.gateway, running.server, running.task)
        stacks.append(stack)
        return stack

    yield factory

    for stack in stacks:
        try:
            await check_invariants(stack)
        finally:
            stack.server.should_exit = True
            await stack.task
            for sim in stack.sims.values():
                await sim.stop()


async def check_invariants(stack: Stack) -> None:
    """docs/reliability.md 4.0: in-flight back to 0, engines idle (abandoned work aborted), one outcome per
    request, and no unbounded label values."""
    async with asyncio.timeout(2):
        while any(v != 0 for _, v in stack.samples("gateway_requests_in_flight")):
            await asyncio.sleep(0.01)
    assert stack.gateway.capacity.total_in_flight == 0
    assert stack.gateway.capacity.retries_in_flight == 0
    for sim in stack.sims.values():
        await sim.wait_until(lambda s: s.active == 0, timeout=2)
    routes = {r.label for r in stack.gateway.config.routes} | {"__unknown__"}
    for labels, _ in stack.samples("gateway_requests_total"):
        assert labels["route"] in routes
        assert labels["outcome"] in get_args(Outcome)  # the fixed set, internal_error included


def chat(model: str = "tiny", content: str = "hello", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], **extra}


async def raw_request(
    base_url: str, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Send a request on a raw socket, so a test can read part of the answer and then vanish."""
    host, port = base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
    head += f"content-length: {len(body)}\r\n"
    for k, v in (headers or {}).items():
        head += f"{k}: {v}\r\n"
    writer.write(head.encode() + b"\r\n" + body)
    await writer.drain()
    return reader, writer


async def small_window_request(base_url: str, payload: dict[str, Any]) -> socket.socket:
    """POST a chat completion on a raw non-blocking socket with a 4 KiB receive buffer, and read
    nothing: the gateway's writes back up at once (a client that stops reading, or reads slowly)."""
    host, port = base_url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (host, int(port)))
    body = json.dumps(payload).encode()
    head = "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    await loop.sock_sendall(sock, f"{head}content-length: {len(body)}\r\n\r\n".encode() + body)
    return sock


def sse_events(raw: bytes) -> list[str]:
    return [e.removeprefix("data: ") for e in raw.decode().split("\n\n") if e.startswith("data: ")]


def content_of(events: list[str]) -> str:
    text = ""
    for e in events:
        if e == "[DONE]":
            continue
        obj = json.loads(e)
        for choice in obj.get("choices", []):
            text += (choice.get("delta") or {}).get("content") or choice.get("text") or ""
    return text


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A real redis-server of the test's own, stopped after it (or by the test, to see Redis go)."""
    server = start_redis()
    try:
        yield server
    finally:
        server.stop()


async def fresh_minute(margin_s: float = 10.0) -> None:
    """Rate limits count over wall-clock minutes: start a test well inside one, so that the window
    cannot turn mid-test and admit a request it should refuse (setup, not an assertion)."""
    left = 60 - time.time() % 60
    if left < margin_s:
        await asyncio.sleep(left + 0.05)
