"""Fixtures for the simulator's tests: ``make_sim(flavour, preset="fast", **overrides)`` starts a SimServer
on a free loopback port and stops it at teardown; ``client`` is an httpx client factory bound to it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from engines.sim.server import SimParams, SimServer
from tests.sim.sim_helpers import SimFactory


@pytest.fixture
async def make_sim() -> AsyncIterator[SimFactory]:
    servers: list[SimServer] = []

    async def factory(flavour: str = "vllm", preset: str = "fast", **overrides: Any) -> SimServer:
        server = SimServer(SimParams.preset(preset, flavour=flavour, **overrides))
        await server.start()
        servers.append(server)
        return server

    yield factory
    for server in servers:
        await server.stop()


@pytest.fixture
async def client() -> AsyncIterator[Callable[[SimServer], httpx.AsyncClient]]:
    clients: list[httpx.AsyncClient] = []

    def factory(server: SimServer) -> httpx.AsyncClient:
        c = httpx.AsyncClient(base_url=server.base_url, timeout=10.0)
        clients.append(c)
        return c

    yield factory
    for c in clients:
        await c.aclose()
