"""An `inference_pool` backend entry against an emulator of the Kubernetes API server
(tests/live/kube_emulator.py, shapes cited there) and simulated engines listening at the pods' IPs
(127.0.0.x on loopback): the real `gateway serve` (uvicorn) routes to the pods the pool lists, as
the watch adds, changes and removes them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from engines.sim.server import SimServer
from gateway.config_loader import parse_config
from gateway.fleet.inference_pool import pod_endpoints, pool_spec
from gateway.serving.server import Running, start
from tests.live.conftest import sim_params
from tests.live.kube_emulator import KubeEmulator, pod

pytestmark = pytest.mark.live

LABELS = {"app.kubernetes.io/name": "vllm", "pod-template-hash": "abc"}
IPS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")


@dataclass
class Cluster:
    api: KubeEmulator
    gateway: Running
    sims: dict[str, SimServer]
    token: Path

    def members(self) -> dict[str, bool]:
        return {b.name: b.healthy for b in self.gateway.gateway.registry if not b.retired}

    def metric(self, name: str, **labels: str) -> float:
        value = self.gateway.gateway.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    async def served_by(self) -> str:
        async with httpx.AsyncClient() as client:
            r = await client.post(
                self.gateway.base_url + "/v1/chat/completions",
                json={"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
                timeout=10,
            )
        assert r.status_code == 200, r.text
        return r.headers["x-gateway-backend"]

    async def ready(self) -> bool:
        async with httpx.AsyncClient() as client:
            return (await client.get(self.gateway.base_url + "/readyz")).status_code == 200


async def until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.02)
    assert check(), what


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind((IPS[0], 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Cluster]:
    port = _free_port()
    sims = {ip: SimServer(sim_params(), host=ip, port=port) for ip in IPS}
    for sim in sims.values():
        await sim.start()
    api = KubeEmulator(ports=[port])
    api.down = bool(getattr(request, "param", False))
    await api.start()
    token = tmp_path / "token"
    token.write_text("token-1\n")
    (tmp_path / "namespace").write_text("llm\n")
    data: dict[str, Any] = {
        "pools": {
            "vllm": {
                "engine": "sim",
                "balancer": "round_robin",
                "backends": [
                    {
                        "name": "vllm",
                        "inference_pool": {"name": "vllm", "api_server": api.url, "token_file": str(token)},
                    }
                ],
            }
        },
        "routes": [{"model": "tiny", "pools": ["vllm"]}],
        "health": {"interval_s": 60, "scrape_interval_s": 60},
    }
    gateway = await start(parse_config(data, env={}))
    for follower in gateway.gateway.pool_followers:
        follower.backoff_s = (0.05, 0.2)
    try:
        yield Cluster(api, gateway, sims, token)
    finally:
        await gateway.stop()
        await api.stop()
        for sim in sims.values():
            await sim.stop()


def name(ip: str, c: Cluster) -> str:
    return f"vllm-{ip}-{c.api.ports[0]}"


async def test_first_list_then_pods_joining_turning_unready_and_leaving(cluster: Cluster) -> None:
    c = cluster
    a, b, d = IPS
    c.api.put(pod("vllm-a", a, LABELS))
    c.api.put(pod("vllm-b", b, LABELS, ready=False))
    c.api.put(pod("other", d, {"app.kubernetes.io/name": "sglang"}))  # not the pool's selector
    await until(lambda: c.members() == {name(a, c): True}, "the first list: only the ready pod of the pool")
    assert await c.ready()
    assert c.metric("gateway_inference_pool_endpoints", pool="vllm", inference_pool="vllm") == 1
    page = c.gateway.gateway.metrics.exposition().decode()
    assert 'gateway_inference_pool_endpoints{inference_pool="vllm",pool="vllm"} 1.0' in page
    assert {await c.served_by() for _ in range(3)} == {name(a, c)}
    assert c.sims[a].stats.seen >= 3

    c.api.put(pod("vllm-b", b, LABELS))  # becomes ready: MODIFIED on the watch
    await until(lambda: c.members() == {name(a, c): True, name(b, c): True}, "b joins")
    assert {await c.served_by() for _ in range(4)} == {name(a, c), name(b, c)}

    c.api.put(pod("vllm-a", a, LABELS, ready=False))  # unready: out of rotation
    await until(lambda: c.members() == {name(b, c): True}, "a leaves when unready")
    assert {await c.served_by() for _ in range(3)} == {name(b, c)}

    terminating = pod("vllm-b", b, LABELS)
    terminating["metadata"]["deletionTimestamp"] = "2026-12-03T17:00:00Z"
    c.api.put(pod("vllm-a", a, LABELS))
    c.api.put(terminating)  # being deleted: no new requests even while still Ready
    await until(lambda: c.members() == {name(a, c): True}, "b leaves while terminating")
    c.api.delete("vllm-b")
    c.api.bookmark()
    assert c.members() == {name(a, c): True}
    assert c.metric("gateway_inference_pool_endpoints", pool="vllm", inference_pool="vllm") == 1


async def test_a_pod_ip_change_moves_the_endpoint(cluster: Cluster) -> None:
    c = cluster
    a, b, _ = IPS
    c.api.put(pod("vllm-0", a, LABELS))
    await until(lambda: c.members() == {name(a, c): True}, "the first list")
    c.api.put(pod("vllm-0", b, LABELS))  # the StatefulSet's pod, recreated elsewhere
    await until(lambda: c.members() == {name(b, c): True}, "the new IP, and only it")
    seen = c.sims[b].stats.seen
    assert await c.served_by() == name(b, c)
    assert c.sims[b].stats.seen == seen + 1


async def test_the_watch_ending_resumes_from_its_version_and_410_lists_again(cluster: Cluster) -> None:
    c = cluster
    a, b, d = IPS
    c.api.put(pod("vllm-a", a, LABELS))
    await until(lambda: name(a, c) in c.members(), "the first list")
    lists = c.api.calls.count("list")
    watches = c.api.calls.count("watch")
    c.api.end_watches()  # the server's timeoutSeconds
    await until(lambda: c.api.calls.count("watch") > watches, "a new watch")
    c.api.put(pod("vllm-b", b, LABELS))
    await until(lambda: name(b, c) in c.members(), "an event on the resumed watch")
    assert c.api.calls.count("list") == lists  # resumed from its resourceVersion, no relist
    assert c.metric("gateway_inference_pool_watch_restarts_total", pool="vllm", inference_pool="vllm", reason="ended")

    c.api.expire()  # history compacted: the open watch gets an ERROR 410
    c.api.put(pod("vllm-d", d, LABELS))
    await until(lambda: c.api.calls.count("list") > lists, "a fresh list after 410")
    await until(lambda: set(c.members()) == {name(a, c), name(b, c), name(d, c)}, "the relist's pods")
    assert c.metric("gateway_inference_pool_watch_restarts_total", pool="vllm", inference_pool="vllm", reason="expired")


@pytest.mark.parametrize("cluster", [True], indirect=True)
async def test_the_api_down_at_start_keeps_readiness_false_and_retries(cluster: Cluster) -> None:
    c = cluster
    pytest.importorskip("grpc")
    from gateway.epp.health import Health
    from gateway.epp.proto import health_pb2

    health = Health(c.gateway.gateway.registry)
    c.api.put(pod("vllm-a", IPS[0], LABELS))
    await until(lambda: c.api.calls.count("get-pool") >= 3, "retries while the API is down")
    assert not c.members()
    assert health.status("readiness") == health_pb2.HealthCheckResponse.NOT_SERVING
    assert not await c.ready()
    assert c.metric("gateway_inference_pool_watch_restarts_total", pool="vllm", inference_pool="vllm", reason="error")
    c.api.down = False
    await until(lambda: c.members() == {name(IPS[0], c): True}, "the first list once the API is back")
    # The members show before the first list's health check returns and marks the pool synced.
    serving = health_pb2.HealthCheckResponse.SERVING
    await until(lambda: health.status("readiness") == serving, "readiness once the first list is applied")
    assert await c.ready()
    c.api.down = True  # the API gone later: the members stay
    c.api.end_watches()
    await until(lambda: c.api.calls.count("get-pool") >= 6, "retries")
    assert c.members() == {name(IPS[0], c): True}
    assert await c.served_by() == name(IPS[0], c)


async def test_the_token_file_is_read_again_for_each_call(cluster: Cluster) -> None:
    c = cluster
    c.api.put(pod("vllm-a", IPS[0], LABELS))
    await until(lambda: bool(c.members()), "the first list")
    assert set(c.api.tokens) == {"Bearer token-1"}
    c.token.write_text("token-2\n")  # the kubelet rotated the bound token
    calls = len(c.api.tokens)
    c.api.end_watches()
    await until(lambda: len(c.api.tokens) > calls + 1, "the next calls")
    assert set(c.api.tokens[calls:]) == {"Bearer token-2"}


async def test_a_reload_keeps_serving_and_ready_while_the_new_gateway_lists_the_pods(cluster: Cluster) -> None:
    from gateway.app.build import GatewayApp

    c = cluster
    c.api.put(pod("vllm-a", IPS[0], LABELS))
    await until(lambda: bool(c.members()), "the first list")
    app = c.gateway.server.config.loaded_app
    assert isinstance(app, GatewayApp)
    c.api.down = True  # the new gateway cannot list yet: the old one serves meanwhile
    reload = asyncio.create_task(app.reload(c.gateway.gateway.config))
    await until(lambda: c.api.calls.count("get-pool") >= 1 and not reload.done(), "the new gateway's first try")
    await asyncio.sleep(0.3)
    assert not reload.done()
    assert await c.ready() and await c.served_by() == name(IPS[0], c)
    c.api.down = False
    await asyncio.wait_for(reload, 10)
    assert app.gateway.registry.synced() and await c.ready()
    assert await c.served_by() == name(IPS[0], c)


def test_pod_and_pool_shapes() -> None:
    ports = (8000, 8001)
    assert pod_endpoints(pod("p", "10.1.2.3", LABELS), ports) == ("10.1.2.3:8000", "10.1.2.3:8001")
    assert pod_endpoints(pod("p", "fd00::5", LABELS), (8000,)) == ("[fd00::5]:8000",)
    assert pod_endpoints(pod("p", None, LABELS), ports) == ()
    assert pod_endpoints(pod("p", "10.1.2.3", LABELS, phase="Pending"), ports) == ()
    assert pod_endpoints(pod("p", "10.1.2.3", LABELS, ready=False), ports) == ()
    spec = {"spec": {"selector": {"matchLabels": {"b": "2", "a": "1"}}, "targetPorts": [{"number": 8000}]}}
    assert pool_spec(spec) == ("a=1,b=2", (8000,))


async def test_outside_a_pod_without_api_server_is_logged_and_retried(caplog: pytest.LogCaptureFixture) -> None:
    from gateway.app.build import build
    from gateway.fleet.inference_pool import PoolFollower

    data = {
        "pools": {"vllm": {"engine": "vllm", "backends": [{"inference_pool": {"name": "vllm"}}]}},
        "routes": [{"model": "tiny", "pools": ["vllm"]}],
    }
    gw = build(parse_config(data, env={}))
    (entry,) = gw.registry.pool_entries
    follower = PoolFollower(gw.registry, entry, gw.health, gw.metrics, env={})
    follower.backoff_s = (0.01, 0.02)
    task = asyncio.create_task(follower.run())
    try:
        await until(lambda: "KUBERNETES_SERVICE_HOST is not set" in caplog.text, "the hint in the log")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await gw.upstream.close()
    assert not gw.registry.synced()
    assert gw.metrics.registry.get_sample_value(
        "gateway_inference_pool_watch_restarts_total", {"pool": "vllm", "inference_pool": "vllm", "reason": "error"}
    )
