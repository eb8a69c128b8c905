"""`gateway demo`: three simulated backends (vLLM, SGLang and llama.cpp flavours) and the gateway
in front of them, with a config that shows routing, caps and metrics. Everything is labelled a
simulator; nothing here pretends to be a real engine."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from engines.sim.server import SimParams, SimServer
from gateway.config import GatewayConfig
from gateway.config_loader import parse_config
from gateway.serving.server import serve

FLAVOURS = ("vllm", "sglang", "llamacpp")


def demo_config(ports: dict[str, int], cap: int = 2048) -> GatewayConfig:
    data: dict[str, Any] = {
        "routing": {
            "platform": "nvidia_gpu",
            "shared_prefix": {"min_seen": 2, "min_prefix_chars": 256, "block_chars": 128},
        },
        "health": {"interval_s": 2.0, "scrape_interval_s": 1.0},
        "pools": {
            name: {
                "engine": "sim",
                "flavour": name,
                "balancer": "prefix_affinity" if name == "sglang" else "least_load",
                "backends": [{"url": f"http://127.0.0.1:{port}", "name": f"sim-{name}", "model": "tiny"}],
            }
            for name, port in ports.items()
        },
        "routes": [
            {
                "model": "demo",
                "pools": ["sglang", "vllm", "llamacpp"],
                "rules": [
                    {"name": "agent-prefix", "when": {"shared_prefix": True}, "pool": "sglang"},
                    {"name": "default", "pool": "vllm"},
                ],
                "caps": {"max_context_tokens": cap, "default_max_tokens": 64, "max_tokens_limit": 512},
            },
            {
                "model": "demo-local",
                "pools": ["llamacpp"],
                "caps": {"max_context_tokens": cap, "default_max_tokens": 64},
            },
        ],
    }
    return parse_config(data, env={})


def banner(host: str, port: int) -> str:
    url = f"http://{host}:{port}"
    plain = json.dumps({"model": "demo", "messages": [{"role": "user", "content": "hello"}]})
    agent = json.dumps(
        {
            "model": "demo",
            "messages": [
                {"role": "system", "content": "You are a careful agent. " * 20},
                {"role": "user", "content": "step 1"},
            ],
        }
    )
    too_long = (
        'python3 -c \'import json; print(json.dumps({"model": "demo", "messages": '
        '[{"role": "user", "content": "word " * 3000}]}))\''
    )
    post = f"curl -s {url}/v1/chat/completions -H 'content-type: application/json'"
    return f"""
Gateway demo: the gateway on {url}, in front of three SIMULATED engines
(vLLM, SGLang and llama.cpp flavours; simulators, not real engines).

Plain chat (routed to the vLLM pool; -D - shows the x-gateway-* headers that say why):
  {post} -D - -d '{plain}'

Shared-prefix agent traffic (send it twice; from the second time on it goes to the SGLang pool):
  {post} -D - -d '{agent}'

An over-long prompt (the route's 2048-token cap rejects it: 400 context_length_exceeded):
  {too_long} | {post} -d @-

Streaming:   add "stream": true to any body above.
Metrics:     curl -s {url}/metrics | grep ^gateway_
Stop:        Ctrl-C
"""


async def run_demo(host: str, port: int, log_level: str = "info") -> None:
    sims = [SimServer(SimParams.preset("demo", flavour=f), host="127.0.0.1", port=0) for f in FLAVOURS]
    try:
        ports = {f: await s.start() for f, s in zip(FLAVOURS, sims, strict=True)}
        config = demo_config(ports)
        started = asyncio.Event()
        server = asyncio.create_task(serve(config, host, port, log_level=log_level, started=started))
        ready = asyncio.create_task(started.wait())
        await asyncio.wait((server, ready), return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        if started.is_set() and not server.done():
            print(banner(host, port), flush=True)
        await server  # raises ListenError at once when the port is taken
    finally:
        for sim in sims:
            with contextlib.suppress(Exception):
                await sim.stop()
