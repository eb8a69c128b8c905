"""`--simulate N`: N simulated backends (vLLM flavour; simulators, not real engines) and a gateway
with the chosen balancer, in this process on ephemeral ports, for what-if runs without GPUs."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from engines.sim.server import SimParams, SimServer
from gateway.config_loader import parse_config
from gateway.serving.server import start

MODEL = "tiny"


@dataclass(frozen=True)
class SimulatedStack:
    target: str  # the gateway's base URL
    engine_metrics: list[str]  # each simulator's /metrics
    policy: str


def stack_config(urls: list[str], policy: str) -> dict[str, Any]:
    return {
        "pools": {
            "sim": {
                "engine": "sim",
                "flavour": "vllm",
                "balancer": policy,
                "backends": [{"url": u, "name": f"sim-{i}", "model": MODEL} for i, u in enumerate(urls)],
            }
        },
        "routes": [{"model": MODEL, "pools": ["sim"]}],
        "health": {"interval_s": 5.0, "scrape_interval_s": 1.0},
    }


@contextlib.asynccontextmanager
async def simulated(n: int, preset: str, policy: str) -> AsyncIterator[SimulatedStack]:
    """Start the simulators and the gateway; stop them all on exit."""
    sims = [SimServer(SimParams.preset(preset, flavour="vllm", model=MODEL)) for _ in range(n)]
    running = None
    try:
        for sim in sims:
            await sim.start()
        config = parse_config(stack_config([s.base_url for s in sims], policy), env={})
        running = await start(config, platform="no_nvidia_gpu")
        yield SimulatedStack(running.base_url, [s.base_url + "/metrics" for s in sims], policy)
    finally:
        if running is not None:
            await running.stop()
        for sim in sims:
            with contextlib.suppress(Exception):
                await sim.stop()
