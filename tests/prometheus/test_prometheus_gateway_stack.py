"""The compose stack without Docker: three simulated engines, the gateway with
deploy/compose/gateway.yaml, and a real Prometheus with the deploy rules. After some traffic, both
lenses' recording rules and the dashboard's first row have data."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.prometheus.prometheus_server import (
    PrometheusServer,
    free_port,
    sources,
    start_prometheus,
    substitute,
    wait_until,
)

pytestmark = [pytest.mark.prometheus, pytest.mark.live]

COMPOSE_CONFIG = sources.DEPLOY / "compose" / "gateway.yaml"
TRAFFIC_S = 5.0


@dataclass
class Stack:
    gateway: str
    prometheus: PrometheusServer


def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=sources.REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


def _local_config(ports: dict[str, int], gateway_port: int) -> dict[str, Any]:
    """deploy/compose/gateway.yaml with the compose service names replaced by loopback ports."""
    config: dict[str, Any] = yaml.safe_load(COMPOSE_CONFIG.read_text(encoding="utf-8"))
    config["server"].update(host="127.0.0.1", port=gateway_port)
    for pool in config["pools"].values():
        for backend in pool["backends"]:
            host = backend["url"].split("//", 1)[1].split(":", 1)[0]
            backend["url"] = f"http://127.0.0.1:{ports[host]}"
    return config


def _chat(client: httpx.Client, url: str, model: str, content: str) -> int:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 16,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        for _ in response.iter_bytes():
            pass
        return response.status_code


def _traffic(url: str, seconds: float) -> list[int]:
    """Streams on both routes from a few clients at once, plus prompts over the chat cap."""
    stop = time.monotonic() + seconds
    statuses: list[int] = []
    lock = threading.Lock()

    def client_loop(model: str, content: str, pause: float) -> None:
        with httpx.Client(timeout=30.0) as client:
            while time.monotonic() < stop:
                status = _chat(client, url, model, content)
                with lock:
                    statuses.append(status)
                time.sleep(pause)

    jobs = [("chat", "Tell me about gateways.", 0.0)] * 3 + [("small", "Hello!", 0.0)]
    jobs += [("chat", "word " * 40_000, 0.2)]  # far over max_context_tokens: rejected by the cap
    with ThreadPoolExecutor(len(jobs)) as pool:
        for future in [pool.submit(client_loop, *job) for job in jobs]:
            future.result()
    return statuses


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    pytest.importorskip("engines.sim.server")
    pytest.importorskip("gateway.serving.server")
    sources.require_binary("prometheus")
    tmp = tmp_path_factory.mktemp("stack")
    processes: list[subprocess.Popen[bytes]] = []
    prometheus: PrometheusServer | None = None
    try:
        ports = {name: free_port() for name in ("vllm", "sglang", "llamacpp")}
        for name, port in ports.items():
            processes.append(
                _spawn(["sim", "--flavour", name, "--host", "127.0.0.1", "--port", str(port)], tmp / f"sim-{name}.log")
            )
        gateway_port = free_port()
        config = tmp / "gateway.yaml"
        config.write_text(yaml.safe_dump(_local_config(ports, gateway_port)), encoding="utf-8")
        processes.append(_spawn(["serve", "--config", str(config)], tmp / "gateway.log"))
        url = f"http://127.0.0.1:{gateway_port}"

        def all_backends_healthy() -> bool:
            for process in processes:
                if process.poll() is not None:
                    logs = "\n".join(p.read_text() for p in sorted(tmp.glob("*.log")))
                    raise AssertionError(f"a process exited with {process.returncode}:\n{logs}")
            try:
                body = httpx.get(f"{url}/readyz", timeout=2.0).json()
            except (httpx.TransportError, ValueError):
                return False
            return bool(body.get("healthy_backends") == len(ports))

        wait_until(all_backends_healthy, 30.0, "the gateway and its three backends")
        prometheus = start_prometheus(tmp / "prometheus", f"127.0.0.1:{gateway_port}", job="gateway")
        prometheus.wait_for_targets_up()
        statuses = _traffic(url, TRAFFIC_S)
        assert 200 in statuses and 400 in statuses, sorted(set(statuses))
        server = prometheus
        wait_until(
            lambda: bool(server.query('gateway:output_tokens_per_second:rate1m{route="small"} > 0')),
            30.0,
            "recording rules over the traffic",
        )
        yield Stack(url, prometheus)
    finally:
        if prometheus is not None:
            prometheus.stop()
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)


def _values(stack: Stack, expr: str) -> dict[str, float]:
    """The result by route (or by pool, for backend rules), summed over the other labels."""
    out: dict[str, float] = {}
    for r in stack.prometheus.query(expr):
        key = r["metric"].get("route", r["metric"].get("pool", ""))
        out[key] = out.get(key, 0.0) + float(r["value"][1])
    return out


@pytest.mark.parametrize(
    "rule",
    [
        "gateway:ttft_seconds:p50",
        "gateway:ttft_seconds:p95",
        "gateway:itl_seconds:p50",
        "gateway:itl_seconds:p95",
        "gateway:request_duration_seconds:p95",
        "gateway:request_tokens_per_second:p50",
        "gateway:request_tokens_per_second:p10",
        "gateway:output_tokens_per_second:rate1m",
        "gateway:prompt_tokens_per_second:rate1m",
        "gateway:requests_per_second:rate1m",
        "gateway:overhead_seconds:p50",
        "gateway:overhead_seconds:p99",
        "gateway:relay_seconds_per_chunk:rate1m",
    ],
)
def test_both_lenses_are_recorded_for_both_routes(stack: Stack, rule: str) -> None:
    values = _values(stack, rule)
    assert {"chat", "small"} <= values.keys(), values
    assert all(v > 0 for route, v in values.items() if route in ("chat", "small")), values


def test_per_request_and_aggregate_speed_differ(stack: Stack) -> None:
    """Three clients stream on chat at once: the machine moves more than any one answer gets.

    rate(...[1m]) spreads the tokens of this 5 s burst over the whole minute, so the aggregate here
    is the burst's tokens over its duration; a real dashboard looks at sustained traffic."""
    tokens = stack.prometheus.value('sum(increase(gateway_output_tokens_total{route="chat"}[1m]))')
    aggregate = tokens / TRAFFIC_S
    per_request = _values(stack, "gateway:request_tokens_per_second:p50")["chat"]
    assert aggregate > 1.5 * per_request > 0


def test_errors_caps_and_backends(stack: Stack) -> None:
    assert _values(stack, "gateway:error_ratio:rate1m") == {"chat": 0.0, "small": 0.0}
    assert _values(stack, "gateway:cap_rejections_per_second:rate1m")["chat"] > 0
    assert 0 < _values(stack, "gateway:cap_rejection_ratio:rate1m")["chat"] < 1
    assert _values(stack, "gateway:backends_up:count") == {"vllm": 1.0, "sglang": 1.0, "llamacpp": 1.0}
    signals = {r["metric"]["signal"] for r in stack.prometheus.query("gateway:backend_load:max")}
    assert {"running", "waiting"} <= signals
    assert _values(stack, "gateway:concurrency").keys() >= {"chat", "small"}


def test_dashboard_first_row_has_data(stack: Stack) -> None:
    panels = sources.dashboard_panels(sources.DASHBOARDS / "gateway.json")
    rows = [p["gridPos"]["y"] for p in panels if p["type"] == "row"]
    top = [p for p in panels if p["type"] != "row" and rows[0] < p["gridPos"]["y"] < rows[1]]
    empty = [
        f"{p['title']} {t['refId']}"
        for p in top
        for t in p["targets"]
        if not stack.prometheus.query(substitute(t["expr"]))
    ]
    assert empty == []


def test_every_deploy_expression_evaluates_against_real_data(stack: Stack) -> None:
    errors = []
    for e in sources.deploy_expressions(substitute=True):
        try:
            stack.prometheus.query(e.expr)
        except AssertionError as exc:
            errors.append(f"{e.where}: {exc}")
    assert errors == []
