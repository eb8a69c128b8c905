"""Tracing against a real OTLP/HTTP receiver (tests/live/otlp_receiver.py): a gateway in front of the
simulator exports one server span per request with its attempts under it, continues a client's
traceparent, hands the engine the attempt's, says when the client left; with tracing off it sends
nothing and loads no OpenTelemetry."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.live.conftest import Stack, StackFactory, chat, raw_request
from tests.live.otlp_receiver import CLIENT, INTERNAL, SERVER, STATUS_ERROR, OtlpReceiver, ReceivedSpan

pytestmark = pytest.mark.live

ROOT = Path(__file__).resolve().parents[2]
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    # The batch processor's delay, read by the SDK from the environment: export within 50 ms.
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_EXPORTER", "OTEL_TRACES_SAMPLER", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(name, raising=False)
    found = OtlpReceiver().start()
    yield found
    found.stop()


@pytest.fixture
async def traced(make_stack: StackFactory, receiver: OtlpReceiver) -> AsyncIterator[Stack]:
    yield await make_stack(tracing={"endpoint": receiver.endpoint, "service_name": "gw-test"})


def parent_of(traceparent: str) -> tuple[str, str, bool]:
    """A traceparent's trace id, parent span id and sampled flag (the SDK also sets the random-id
    flag, 0x02, of W3C Trace Context level 2)."""
    version, trace_id, span_id, flags = traceparent.split("-")
    assert version == "00"
    return trace_id, span_id, bool(int(flags, 16) & 1)


def one_request(spans: list[ReceivedSpan]) -> bool:
    return any(s.kind == SERVER for s in spans)


def by_kind(spans: list[ReceivedSpan], kind: int) -> list[ReceivedSpan]:
    return [s for s in spans if s.kind == kind]


REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", chat(max_tokens=5)),
    "messages": ("/v1/messages", {"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}),
    "responses": ("/v1/responses", {"model": "tiny", "max_output_tokens": 5, "input": "hello there"}),
}


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
@pytest.mark.parametrize("api", list(REQUESTS))
async def test_one_request_one_trace(traced: Stack, receiver: OtlpReceiver, api: str, stream: bool) -> None:
    path, body = REQUESTS[api]
    async with httpx.AsyncClient(base_url=traced.base_url) as client:
        resp = await client.post(path, json={**body, "stream": stream}, headers={"x-request-id": "req-1"})
        assert resp.status_code == 200, resp.text
    spans = await receiver.wait(one_request)
    [server] = by_kind(spans, SERVER)
    [attempt] = by_kind(spans, CLIENT)
    assert server.service == "gw-test"
    assert server.name == f"POST {path}"
    assert server.parent_id == ""  # a new trace: the client sent no traceparent
    assert attempt.trace_id == server.trace_id and attempt.parent_id == server.span_id
    a = server.attributes
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == "tiny" and a["gen_ai.response.model"] == "tiny"
    assert a["gen_ai.request.max_tokens"] == 5
    assert a["gen_ai.request.stream"] is stream
    assert a["gen_ai.usage.input_tokens"] > 0 and 0 < a["gen_ai.usage.output_tokens"] <= 5
    assert a["gateway.outcome"] == "success" and a["http.response.status_code"] == 200
    assert a["gateway.route"] == "tiny" and a["gateway.pool"] == "vllm" and a["gateway.backend"] == "vllm-0"
    assert a["gateway.balancer"] == "least_load" and a["gateway.balancer.reason"] == "least_load"
    assert a["gateway.backends_in_order"] == ["vllm-0"] and a["gateway.queued"] is False
    assert a["gateway.request_id"] == "req-1"
    assert server.status != STATUS_ERROR
    assert "gen_ai.prompt" not in {name for name, _ in server.events}  # no content unless asked for
    if stream:
        first = server.event("gen_ai.first_token")
        assert first is not None and 0 < first["gen_ai.server.time_to_first_token"] < 5
    else:
        assert server.event("gen_ai.first_token") is None
    b = attempt.attributes
    assert attempt.name == "chat tiny"
    assert b["gen_ai.provider.name"] == "sim" and b["gateway.backend"] == "vllm-0" and b["gateway.attempt"] == 1
    assert b["server.address"] == "127.0.0.1" and b["server.port"] == int(traced.sims["vllm-0"].base_url.split(":")[-1])
    assert b["gateway.attempt.result"] == "answered" and b["gateway.pool"] == "vllm" and a["gateway.rule"]
    assert server.start_ns <= attempt.start_ns <= attempt.end_ns <= server.end_ns
    # The engine got the attempt's context; the request id is the client's.
    headers = traced.sims["vllm-0"].stats.recent[-1].headers
    assert parent_of(headers["traceparent"]) == (server.trace_id, attempt.span_id, True)
    assert headers["x-request-id"] == "req-1"


async def test_a_client_traceparent_is_continued(traced: Stack, receiver: OtlpReceiver) -> None:
    parent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    async with httpx.AsyncClient(base_url=traced.base_url) as client:
        headers = {"traceparent": parent, "tracestate": "vendor=abc"}
        resp = await client.post("/v1/chat/completions", json=chat(max_tokens=3), headers=headers)
        assert resp.status_code == 200
    spans = await receiver.wait(one_request)
    [server] = by_kind(spans, SERVER)
    [attempt] = by_kind(spans, CLIENT)
    assert (server.trace_id, server.parent_id) == (CLIENT_TRACE, CLIENT_SPAN)
    assert attempt.trace_id == CLIENT_TRACE
    sent = traced.sims["vllm-0"].stats.recent[-1].headers
    assert parent_of(sent["traceparent"]) == (CLIENT_TRACE, attempt.span_id, True)
    assert sent["tracestate"] == "vendor=abc"


async def test_an_unsampled_parent_is_followed(traced: Stack, receiver: OtlpReceiver) -> None:
    """The client's sampled flag off: nothing recorded, and the engine is told the same."""
    async with httpx.AsyncClient(base_url=traced.base_url) as client:
        headers = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-00"}
        assert (await client.post("/v1/chat/completions", json=chat(max_tokens=3), headers=headers)).status_code == 200
        headers = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}  # then one that is sampled
        assert (await client.post("/v1/chat/completions", json=chat(max_tokens=3), headers=headers)).status_code == 200
    unsampled, sampled = traced.sims["vllm-0"].stats.recent
    trace_id, _, sampled_flag = parent_of(unsampled.headers["traceparent"])
    assert trace_id == CLIENT_TRACE and not sampled_flag
    spans = await receiver.wait(one_request)
    assert len(by_kind(spans, SERVER)) == 1  # only the sampled one
    assert parent_of(sampled.headers["traceparent"]) == (CLIENT_TRACE, by_kind(spans, CLIENT)[0].span_id, True)


async def test_a_client_that_leaves_mid_stream(traced: Stack, receiver: OtlpReceiver) -> None:
    body = json.dumps(chat(stream=True, max_tokens=500)).encode()
    reader, writer = await raw_request(
        traced.base_url, "/v1/chat/completions", body, {"x-sim-fault": "chunk_delay=0.02"}
    )
    got = b""
    while len(got) < 600:
        chunk = await reader.read(600 - len(got))
        assert chunk
        got += chunk
    writer.close()
    await writer.wait_closed()
    spans = await receiver.wait(one_request)
    [server] = by_kind(spans, SERVER)
    [attempt] = by_kind(spans, CLIENT)
    assert server.attributes["gateway.outcome"] == "client_closed"
    assert server.attributes["gateway.disconnect_stage"] == "mid_stream"
    assert server.attributes["error.type"] == "client_closed"
    assert server.status == STATUS_ERROR and "client closed" in server.status_message
    assert server.event("gateway.client_left") == {"gateway.disconnect_stage": "mid_stream"}
    assert server.event("gen_ai.first_token") is not None
    assert attempt.status == STATUS_ERROR and attempt.attributes["gateway.attempt.result"] == "client_left"


async def test_a_retry_is_a_second_attempt(make_stack: StackFactory, receiver: OtlpReceiver) -> None:
    from tests.live.conftest import sim_params

    stack = await make_stack(
        pools={"vllm": [sim_params(), sim_params()]},
        tracing={"endpoint": receiver.endpoint, "service_name": "gw-test"},
        pool_vllm={"balancer": "first_healthy"},
    )
    async with httpx.AsyncClient(base_url=stack.base_url) as client:
        await stack.sims["vllm-0"].stop()  # the first backend refuses the connection: the second answers
        resp = await client.post("/v1/chat/completions", json=chat(max_tokens=3))
    assert resp.status_code == 200, resp.text
    spans = await receiver.wait(lambda s: one_request(s) and len(by_kind(s, CLIENT)) == 2)
    [server] = by_kind(spans, SERVER)
    failed, answered = sorted(by_kind(spans, CLIENT), key=lambda s: s.attributes["gateway.attempt"])
    assert failed.parent_id == answered.parent_id == server.span_id
    assert failed.status == STATUS_ERROR and failed.attributes["gateway.attempt.result"] == "failed"
    assert failed.attributes["gateway.backend"] == "vllm-0" and answered.attributes["gateway.backend"] == "vllm-1"
    assert server.attributes["gateway.backend"] == "vllm-1" and server.attributes["gateway.outcome"] == "success"


async def test_a_queued_request_has_a_queue_span(make_stack: StackFactory, receiver: OtlpReceiver) -> None:
    from tests.live.conftest import sim_params

    stack = await make_stack(
        pools={"vllm": [sim_params()]},
        tracing={"endpoint": receiver.endpoint, "service_name": "gw-test"},
        limits={"max_queue": 4, "queue_timeout_s": 10},
    )
    stack.gateway.registry.by_name["vllm-0"].max_in_flight = 1
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=20) as client:
        slow = chat(max_tokens=30)
        await asyncio.gather(
            client.post("/v1/chat/completions", json=slow, headers={"x-sim-fault": "chunk_delay=0.01"}),
            client.post("/v1/chat/completions", json=chat(max_tokens=3)),
        )
    spans = await receiver.wait(lambda s: len(by_kind(s, SERVER)) == 2)
    [queue] = by_kind(spans, INTERNAL)
    [waited] = [s for s in by_kind(spans, SERVER) if s.attributes["gateway.queued"]]
    assert queue.name == "gateway.queue" and queue.parent_id == waited.span_id
    assert queue.end_ns - queue.start_ns > 0 and waited.attributes["gateway.queue_wait_s"] > 0


async def test_content_only_when_asked(make_stack: StackFactory, receiver: OtlpReceiver) -> None:
    tracing = {"endpoint": receiver.endpoint, "service_name": "gw-test", "capture_content": True}
    stack = await make_stack(tracing={**tracing, "max_content_chars": 40})
    async with httpx.AsyncClient(base_url=stack.base_url) as client:
        resp = await client.post("/v1/chat/completions", json=chat(content="tell me " * 50, max_tokens=3))
        assert resp.status_code == 200
        sent = resp.request.content.decode()
    [server] = by_kind(await receiver.wait(one_request), SERVER)
    prompt, answer = server.event("gen_ai.prompt"), server.event("gen_ai.completion")
    assert prompt is not None and answer is not None
    assert len(prompt["gen_ai.content"]) == 40 and prompt["gateway.content.truncated"] is True
    assert prompt["gen_ai.content"] == sent[:40]
    assert answer["gen_ai.content"].startswith("{")


async def test_tracing_off_sends_nothing_and_forwards_the_traceparent(
    make_stack: StackFactory, receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`enabled: false` wins over the OTEL_* variables; the client's traceparent goes on as it came."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    stack = await make_stack(tracing={"enabled": False, "endpoint": receiver.endpoint})
    parent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    async with httpx.AsyncClient(base_url=stack.base_url) as client:
        resp = await client.post("/v1/chat/completions", json=chat(max_tokens=3), headers={"traceparent": parent})
        assert resp.status_code == 200
    assert stack.sims["vllm-0"].stats.recent[-1].headers["traceparent"] == parent
    await asyncio.sleep(0.3)  # past the batch delay a tracer would have used
    assert receiver.posts == 0 and stack.gateway.tracing.enabled is False


async def test_the_variables_alone_turn_tracing_on(
    make_stack: StackFactory, receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    stack = await make_stack()
    async with httpx.AsyncClient(base_url=stack.base_url) as client:
        assert (await client.post("/v1/chat/completions", json=chat(max_tokens=3))).status_code == 200
    [server] = by_kind(await receiver.wait(one_request), SERVER)
    assert server.service == "from-env"


def test_tracing_off_imports_no_opentelemetry() -> None:
    """A gateway built and serving a request with tracing off never loads OpenTelemetry (a fresh
    interpreter: this one has it loaded)."""
    script = """
import asyncio, sys
import httpx
from engines.sim.server import SimParams, SimServer
from gateway.config_loader import parse_config
from gateway.serving.server import start

async def main():
    sim = SimServer(SimParams.preset("fast", flavour="vllm"))
    await sim.start()
    config = parse_config({"pools": {"p": {"engine": "sim", "backends": [{"url": sim.base_url, "model": "tiny"}]}},
                           "routes": [{"model": "tiny", "pools": ["p"]}]}, env={})
    running = await start(config, platform="nvidia_gpu")
    async with httpx.AsyncClient(base_url=running.base_url) as client:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        r = await client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
    running.server.should_exit = True
    await running.task
    await sim.stop()
    loaded = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
    assert not loaded, loaded
    assert "gateway.tracing.recorder" not in sys.modules
    print("ok")

asyncio.run(main())
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


OPENMETRICS_ACCEPT = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
"""What Prometheus sends when it scrapes."""


async def test_latency_histograms_carry_the_trace_id(traced: Stack, receiver: OtlpReceiver) -> None:
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    async with httpx.AsyncClient(base_url=traced.base_url) as client:
        resp = await client.post("/v1/chat/completions", json=chat(max_tokens=3, stream=True))
        assert resp.status_code == 200
        [server] = by_kind(await receiver.wait(one_request), SERVER)
        page = await client.get("/metrics", headers={"accept": OPENMETRICS_ACCEPT})
        plain = await client.get("/metrics")
    assert page.headers["content-type"].startswith("application/openmetrics-text")
    exemplars = {
        s.name: s.exemplar.labels["trace_id"]
        for family in text_string_to_metric_families(page.text)  # type: ignore[no-untyped-call]
        for s in family.samples
        if s.exemplar is not None
    }
    for name in ("gateway_request_duration_seconds", "gateway_time_to_first_token_seconds", "gateway_overhead_seconds"):
        assert exemplars.get(f"{name}_bucket") == server.trace_id, name
    assert plain.headers["content-type"].startswith("text/plain") and "# {" not in plain.text


async def test_no_openmetrics_without_tracing(make_stack: StackFactory) -> None:
    stack = await make_stack()
    async with httpx.AsyncClient(base_url=stack.base_url) as client:
        assert (await client.post("/v1/chat/completions", json=chat(max_tokens=3))).status_code == 200
        page = await client.get("/metrics", headers={"accept": OPENMETRICS_ACCEPT})
    assert page.headers["content-type"].startswith("text/plain") and "# {" not in page.text


async def test_a_new_trace_left_out_still_tells_the_engine(make_stack: StackFactory, receiver: OtlpReceiver) -> None:
    """sample_ratio 0: a request without a traceparent records nothing, and the engine gets a
    context with the sampled flag off; a client's sampled trace is still followed."""
    stack = await make_stack(tracing={"endpoint": receiver.endpoint, "service_name": "gw-test", "sample_ratio": 0})
    async with httpx.AsyncClient(base_url=stack.base_url) as client:
        assert (await client.post("/v1/chat/completions", json=chat(max_tokens=3))).status_code == 200
        headers = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}
        assert (await client.post("/v1/chat/completions", json=chat(max_tokens=3), headers=headers)).status_code == 200
    left_out, followed = stack.sims["vllm-0"].stats.recent
    trace_id, span_id, sampled = parent_of(left_out.headers["traceparent"])
    assert not sampled and trace_id != CLIENT_TRACE and int(trace_id, 16) and int(span_id, 16)
    spans = await receiver.wait(one_request)
    [server] = by_kind(spans, SERVER)
    assert server.trace_id == CLIENT_TRACE
    assert parent_of(followed.headers["traceparent"]) == (CLIENT_TRACE, by_kind(spans, CLIENT)[0].span_id, True)
    assert len(by_kind(spans, SERVER)) == 1


async def test_the_exporter_variables_are_honoured(
    make_stack: StackFactory, receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (the full URL), _HEADERS (percent-decoded), _COMPRESSION and
    OTEL_RESOURCE_ATTRIBUTES, as the SDK reads them."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{receiver.endpoint}/v1/traces")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-team=blue%20green,x-other=1")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-resource,deployment.environment=test")
    stack = await make_stack()
    async with httpx.AsyncClient(base_url=stack.base_url) as client:
        assert (await client.post("/v1/chat/completions", json=chat(max_tokens=3))).status_code == 200
    [server] = by_kind(await receiver.wait(one_request), SERVER)
    assert server.service == "from-resource"
    sent = receiver.headers[-1]
    assert sent["x-team"] == "blue green" and sent["x-other"] == "1" and sent["content-encoding"] == "gzip"


def exporter_for(receiver: OtlpReceiver, **env: str) -> Any:
    from gateway.tracing import otlp
    from gateway.tracing.exporter import BatchExporter
    from gateway.tracing.settings import tracing_settings

    settings = tracing_settings(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, **env})
    assert settings is not None
    return BatchExporter(settings.export, otlp.resource({"service.name": "unit"}), otlp.scope("s", ""))


def span_named(name: str) -> Any:
    from gateway.tracing.record import SERVER as KIND
    from gateway.tracing.record import SpanRecord

    record = SpanRecord(name, KIND, 1, 2, 0, 10, {"k": "v"})
    record.end_ns = 20
    return record


def test_the_exporter_drops_when_full(receiver: OtlpReceiver) -> None:
    """Five spans into a queue of three before the thread can run (a long switch interval keeps it
    off the GIL): two are dropped and counted, the three kept go as one batch."""
    exporter = exporter_for(receiver, OTEL_BSP_SCHEDULE_DELAY="60000", OTEL_BSP_MAX_QUEUE_SIZE="3")
    assert exporter._thread is None  # nothing recorded: no thread to wake
    interval = sys.getswitchinterval()
    quiet = logging.getLogger("gateway.tracing")
    quiet.disabled = True  # the drop's warning, written out, would let the thread in
    sys.setswitchinterval(5.0)
    try:
        for n in range(5):
            exporter.add(span_named(f"s{n}"))
    finally:
        sys.setswitchinterval(interval)
        quiet.disabled = False
    assert exporter.dropped == 2
    exporter.shutdown()
    assert receiver.posts == 1 and [s.name for s in receiver.snapshot()] == ["s0", "s1", "s2"]
    assert exporter.exported == 3


def test_shutdown_sends_what_is_queued(receiver: OtlpReceiver) -> None:
    exporter = exporter_for(receiver, OTEL_BSP_SCHEDULE_DELAY="60000")
    exporter.add(span_named("queued"))
    time.sleep(0.2)
    assert receiver.posts == 0  # the delay (60 s) has not passed
    exporter.shutdown()
    assert [s.name for s in receiver.snapshot()] == ["queued"] and exporter.exported == 1


def test_a_full_batch_goes_before_the_delay(receiver: OtlpReceiver) -> None:
    exporter = exporter_for(receiver, OTEL_BSP_SCHEDULE_DELAY="60000", OTEL_BSP_MAX_EXPORT_BATCH_SIZE="2")
    for n in range(2):
        exporter.add(span_named(f"s{n}"))
    spans = receiver.wait_blocking(lambda s: len(s) == 2, timeout=5)
    assert [s.name for s in spans] == ["s0", "s1"]
    exporter.shutdown()


def test_a_collector_that_is_down_loses_the_batch_not_the_exporter(receiver: OtlpReceiver) -> None:
    from gateway.tracing import otlp
    from gateway.tracing.exporter import BatchExporter
    from gateway.tracing.settings import tracing_settings

    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_BSP_SCHEDULE_DELAY": "1"}  # nothing listens
    settings = tracing_settings(None, env)
    assert settings is not None
    exporter = BatchExporter(settings.export, otlp.resource({}), otlp.scope("s", ""))
    exporter.add(span_named("lost"))
    exporter.shutdown()
    assert exporter.exported == 0 and exporter._thread is not None and not exporter._thread.is_alive()
