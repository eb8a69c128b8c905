"""Config reload (docs/reliability.md item 20): a new gateway is swapped in while streams in flight finish on
the old one; SIGHUP re-reads the file, and an invalid file keeps the running config."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from engines.sim.server import SimServer
from gateway.app.build import GatewayApp
from gateway.config_loader import parse_config
from tests.live.conftest import StackFactory, chat, content_of, sim_params, sse_events
from tests.live.test_demo import free_port

pytestmark = pytest.mark.live


async def test_reload_swaps_backends_and_lets_streams_finish(make_stack: StackFactory) -> None:
    stack = await make_stack()
    old_sim = stack.sims["vllm-0"]
    async with SimServer(sim_params()) as new_sim, httpx.AsyncClient(timeout=20) as client:
        stream = asyncio.create_task(
            client.post(
                stack.base_url + "/v1/chat/completions",
                json=chat(stream=True, max_tokens=40),
                headers={"x-sim-fault": "chunk_delay=0.02"},
            )
        )
        await old_sim.wait_until(lambda s: s.active == 1, timeout=3)
        app = stack.server.config.loaded_app
        assert isinstance(app, GatewayApp)
        await app.reload(
            parse_config(
                {
                    "pools": {
                        "vllm": {
                            "engine": "sim",
                            "backends": [{"url": new_sim.base_url, "name": "fresh", "model": "tiny"}],
                        }
                    },
                    "routes": [{"model": "tiny", "pools": ["vllm"]}, {"model": "added", "pools": ["vllm"]}],
                },
                env={},
            )
        )
        r = await client.post(stack.base_url + "/v1/chat/completions", json=chat(model="added", max_tokens=1))
        assert r.status_code == 200 and r.headers["x-gateway-backend"] == "fresh"
        old = await stream
        assert sse_events(old.content)[-1] == "[DONE]" and old.headers["x-gateway-backend"] == "vllm-0"
        assert new_sim.stats.seen == 1 and old_sim.stats.completed == 1
        models = (await client.get(stack.base_url + "/v1/models")).json()
        assert [m["id"] for m in models["data"]] == ["tiny", "added"]
    # Metrics carry over: both requests are in the same registry.
    assert stack.total("gateway_requests_total", outcome="success") == 2
    stack.gateway = app.gateway  # the invariants are checked on the gateway now serving


def test_sighup_reloads_the_file_and_refuses_a_bad_one(tmp_path: Path) -> None:
    port = free_port()
    cfg = tmp_path / "g.yaml"
    pools = "pools: {p: {engine: vllm, backends: [{url: 'http://127.0.0.1:9'}]}}\n"
    cfg.write_text(pools + "routes: [{model: one, pools: [p]}]\n")
    log = tmp_path / "gateway.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gateway.cli",
                "serve",
                "--config",
                str(cfg),
                "--port",
                str(port),
                "--log-level",
                "warning",
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}/v1/models"

    def models() -> list[str]:
        return [m["id"] for m in json.loads(httpx.get(url, timeout=2).text)["data"]]

    def wait(predicate: object) -> None:
        deadline = time.monotonic() + 15
        while True:
            try:
                if predicate():  # type: ignore[operator]
                    return
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)

    try:
        wait(lambda: models() == ["one"])
        cfg.write_text(pools + "routes: [{model: two, pools: [p]}]\n")
        proc.send_signal(signal.SIGHUP)
        wait(lambda: models() == ["two"])
        cfg.write_text("pools: {p: {engine: nope, backends: []}}\nroutes: []\n")
        proc.send_signal(signal.SIGHUP)
        wait(lambda: "refused" in log.read_text())
        assert models() == ["two"] and proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    out = log.read_text()
    assert "reload of" in out and "refused" in out and "pools.p.engine" in out


async def test_a_reload_never_cuts_a_long_stream(make_stack: StackFactory) -> None:
    """docs/reliability.md defect 1: the old session was closed drain_timeout_s after a reload, under the
    streams still running on it: the client got nothing for idle_s, then `timeout_idle`."""
    stack = await make_stack(server={"drain_timeout_s": 0.3}, timeouts={"idle_s": 3})
    app = stack.server.config.loaded_app
    assert isinstance(app, GatewayApp)
    old = app.gateway
    arrivals: list[float] = []
    body = b""
    async with httpx.AsyncClient(timeout=30) as client:

        async def stream() -> None:
            nonlocal body
            async with client.stream(
                "POST",
                stack.base_url + "/v1/chat/completions",
                json=chat(stream=True, max_tokens=40),
                headers={"x-sim-fault": "chunk_delay=0.05"},
            ) as r:
                assert r.status_code == 200
                async for chunk in r.aiter_bytes():
                    arrivals.append(time.monotonic())
                    body += chunk

        task = asyncio.create_task(stream())
        await stack.sims["vllm-0"].wait_until(lambda s: s.active == 1, timeout=3)
        await app.reload(stack.gateway.config)  # the same config, as after a SIGHUP on an unchanged file
        await task
    events = sse_events(body)
    assert events[-1] == "[DONE]" and not any('"error"' in e for e in events)
    assert len(content_of(events)) > 0
    final = json.loads(events[-2])
    assert final["choices"][0]["finish_reason"] == "length"
    assert stack.sims["vllm-0"].stats.completed == 1 and stack.sims["vllm-0"].stats.aborted == 0
    gap = max(b - a for a, b in itertools.pairwise(arrivals))
    assert gap < 1.5, f"a {gap:.1f} s silence mid-stream"  # chunks come every 0.05 s
    assert stack.total("gateway_requests_total", outcome="success") == 1
    for _ in range(50):  # the old gateway's session is closed once its stream is done
        if old.upstream.closed:
            break
        await asyncio.sleep(0.1)
    assert old.upstream.closed
    stack.gateway = app.gateway
