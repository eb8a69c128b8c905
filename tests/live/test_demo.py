"""`gateway demo` as a newcomer runs it: a subprocess, the three kinds of request from its banner,
/metrics, and a clean stop on Ctrl-C (SIGINT)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

pytestmark = [pytest.mark.live, pytest.mark.slow]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_demo_end_to_end() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "demo", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "demo did not become ready"
            time.sleep(0.1)
        with httpx.Client(base_url=url, timeout=30) as client:
            listed = [m["id"] for m in client.get("/v1/models").json()["data"]]
            assert listed == ["demo", "demo-local"]  # the README's snippet uses "demo"
            plain = client.post(
                "/v1/chat/completions", json={"model": "demo", "messages": [{"role": "user", "content": "hello"}]}
            )
            assert plain.status_code == 200 and plain.json()["choices"][0]["message"]["content"]
            assert plain.headers["x-gateway-pool"] == "vllm"
            agent = {
                "model": "demo",
                "max_tokens": 4,
                "messages": [
                    {"role": "system", "content": "You are a careful agent. " * 20},
                    {"role": "user", "content": "step 1"},
                ],
            }
            pools = [client.post("/v1/chat/completions", json=agent).headers["x-gateway-pool"] for _ in range(3)]
            assert pools[0] == "vllm" and pools[1:] == ["sglang", "sglang"]
            long = client.post(
                "/v1/chat/completions",
                json={"model": "demo", "messages": [{"role": "user", "content": "word " * 3000}]},
            )
            assert long.status_code == 400
            assert long.json()["error"]["code"] == "context_length_exceeded"
            stream = client.post("/v1/chat/completions", json={**agent, "stream": True})
            assert stream.text.rstrip().endswith("data: [DONE]")
            metrics = client.get("/metrics").text
        assert 'gateway_route_decisions_total{pool="sglang",route="demo",rule="agent-prefix"} 3.0' in metrics
        assert 'gateway_context_cap_total{action="rejected"' in metrics
        assert "gateway_time_to_first_token_seconds_bucket" in metrics
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0, out
    assert "SIMULATED" in out


def test_serve_drains_and_exits_0_on_sigterm(tmp_path: object) -> None:
    from pathlib import Path

    port = free_port()
    cfg = Path(str(tmp_path)) / "g.yaml"
    cfg.write_text(
        "pools: {p: {engine: vllm, backends: [{url: 'http://127.0.0.1:9'}]}}\n"
        "routes: [{model: m, pools: [p]}]\nserver: {drain_timeout_s: 1}\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=1 + 5)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
