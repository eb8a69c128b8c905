"""One trace from the client through the gateway into a real vLLM: vLLM 0.32 started with
--otlp-traces-endpoint to the same OTLP/HTTP receiver as the gateway continues the traceparent the
gateway sends, so its request span sits under the gateway's upstream attempt (same trace id, the
attempt's span id as parent). One vLLM start (about a minute on a CPU)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.integration.gateway_harness import running_gateway
from tests.live.otlp_receiver import CLIENT, SERVER, OtlpReceiver, ReceivedSpan

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # the gateway's batch processor
    found = OtlpReceiver().start()
    yield found
    found.stop()


def test_vllm_spans_sit_under_the_gateways_attempts(
    engine_launcher: Callable[..., Any], receiver: OtlpReceiver
) -> None:
    # vLLM's exporter speaks gRPC unless told otherwise, and takes the endpoint as the full traces URL.
    vllm = engine_launcher(
        "vllm",
        extra_args=["--otlp-traces-endpoint", f"{receiver.endpoint}/v1/traces"],
        extra_env={
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_SERVICE_NAME": "vllm-under-test",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        },
    )
    config = {
        "pools": {"vllm": {"engine": "vllm", "backends": [{"url": vllm.base_url}]}},
        "routes": [{"model": "tiny", "pools": ["vllm"]}],
        "tracing": {"endpoint": receiver.endpoint, "service_name": "gateway-under-test"},
    }
    parent = f"00-{CLIENT_TRACE}-00f067aa0ba902b7-01"
    with running_gateway(config) as gw:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
        with httpx.Client(base_url=gw.base_url, timeout=120) as client:
            assert client.post("/v1/chat/completions", json=body).status_code == 200
            with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as resp:
                assert resp.status_code == 200
                resp.read()
            assert client.post("/v1/chat/completions", json=body, headers={"traceparent": parent}).status_code == 200
        gw.settle()

        def engine(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
            """vLLM's spans of requests (it also exports its start-up's: Worker init, Load weights...)."""
            return [s for s in spans if s.service == "vllm-under-test" and s.name == "llm_request"]

        def gateway(spans: list[ReceivedSpan], kind: int) -> list[ReceivedSpan]:
            return [s for s in spans if s.service == "gateway-under-test" and s.kind == kind]

        spans = receiver.wait_blocking(lambda s: len(engine(s)) >= 3 and len(gateway(s, SERVER)) == 3)
    attempts = gateway(spans, CLIENT)
    assert len(attempts) == 3
    under: dict[str, ReceivedSpan] = {s.parent_id: s for s in engine(spans)}
    for attempt in attempts:
        found = under.get(attempt.span_id)
        assert found is not None, (
            f"no vLLM span under {attempt.name}; vLLM's: {[(s.name, s.parent_id) for s in engine(spans)]}"
        )
        assert found.trace_id == attempt.trace_id
        assert found.start_ns >= attempt.start_ns and found.end_ns <= attempt.end_ns + 50_000_000
        # vLLM reports the same request in GenAI terms.
        assert found.attributes.get("gen_ai.request.max_tokens") == 4
    # The client's trace runs through both: gateway server span, attempt, engine span.
    assert CLIENT_TRACE in {s.trace_id for s in engine(spans)}
