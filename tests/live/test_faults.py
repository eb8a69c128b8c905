"""Backend faults (docs/reliability.md 4.1), injected with the simulator's x-sim-fault knobs."""

from __future__ import annotations

import json

import httpx
import pytest

from gateway.upstream.client import UpstreamResponse
from tests.live.conftest import StackFactory, chat, sim_params, sse_events

pytestmark = pytest.mark.live

FAST_TIMEOUTS = {"timeouts": {"connect_s": 1.0, "first_byte_s": 1.0, "idle_s": 0.5, "keepalive_s": 0}}


async def post(base: str, body: dict[str, object], fault: str = "", **headers: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.post(
            base + "/v1/chat/completions", json=body, headers={"x-sim-fault": fault, **headers} if fault else headers
        )


def error_of(r: httpx.Response) -> dict[str, object]:
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("die", ["fin", "rst"])
async def test_backend_dies_mid_stream(make_stack: StackFactory, die: str) -> None:
    stack = await make_stack()
    r = await post(stack.base_url, chat(stream=True, max_tokens=50), f"die_after=3;die={die}")
    assert r.status_code == 200
    events = sse_events(r.content)
    assert "[DONE]" not in events  # a cut-off stream must look cut off
    last = json.loads(events[-1])
    assert last["error"]["type"] == "upstream_error"
    contents = [e for e in events[:-1] if '"content":"' in e and '"content":""' not in e]
    assert len(contents) == 3
    assert stack.total("gateway_requests_total", outcome="upstream_error_midstream") == 1
    assert stack.sims["vllm-0"].stats.seen == 1  # never retried after bytes reached the client


async def test_stall_mid_stream_hits_the_idle_timeout(make_stack: StackFactory) -> None:
    stack = await make_stack(**FAST_TIMEOUTS)
    r = await post(stack.base_url, chat(stream=True, max_tokens=50), "stall_after=2")
    events = sse_events(r.content)
    assert json.loads(events[-1])["error"]["code"] == "timeout_idle"
    await stack.sims["vllm-0"].wait_until(lambda s: s.aborted == 1, timeout=1)
    assert stack.total("gateway_requests_total", outcome="timeout_idle") == 1


async def test_slow_first_byte_retries_on_another_backend(make_stack: StackFactory) -> None:
    stack = await make_stack(
        pools={"vllm": [sim_params(fault="headers_delay=5"), sim_params()]},
        pool_vllm={"balancer": "first_healthy"},
        **FAST_TIMEOUTS,
    )
    r = await post(stack.base_url, chat(max_tokens=2))
    assert r.status_code == 200 and r.headers["x-gateway-backend"] == "vllm-1"
    await stack.sims["vllm-0"].wait_until(lambda s: s.aborted == 1, timeout=1)
    assert stack.total("gateway_retries_total") == 1
    assert stack.total("gateway_upstream_errors_total", kind="timeout_ttfb") == 1


async def test_no_first_byte_anywhere_is_504(make_stack: StackFactory) -> None:
    stack = await make_stack(pools={"vllm": [sim_params(fault="never=1")]}, **FAST_TIMEOUTS)
    r = await post(stack.base_url, chat(stream=True))
    assert r.status_code == 504  # a normal HTTP error: no stream had started
    assert error_of(r)["code"] == "upstream_timeout"
    assert stack.total("gateway_requests_total", outcome="timeout_ttfb") == 1


async def test_500_is_retried_then_502_with_a_clean_body(make_stack: StackFactory) -> None:
    stack = await make_stack(
        pools={"vllm": [sim_params(fault="status=500;body=html"), sim_params()]},
        pool_vllm={"balancer": "first_healthy"},
    )
    r = await post(stack.base_url, chat(max_tokens=1))
    assert r.status_code == 200 and r.headers["x-gateway-backend"] == "vllm-1"
    solo = await make_stack(pools={"vllm": [sim_params(fault="status=500;body=html")]})
    r = await post(solo.base_url, chat(max_tokens=1))
    assert r.status_code == 502
    err = error_of(r)
    assert err["type"] == "upstream_error"
    assert "<html" not in str(err["message"]).lower() and "127.0.0.1" not in str(err["message"])


async def test_five_failures_eject_a_backend(make_stack: StackFactory) -> None:
    stack = await make_stack(
        pools={"vllm": [sim_params(fault="status=503"), sim_params()]},
        pool_vllm={"balancer": "first_healthy"},
        retry={"budget_min": 10},
    )
    for _ in range(5):
        assert (await post(stack.base_url, chat(max_tokens=1))).status_code == 200
    assert not stack.gateway.registry.by_name["vllm-0"].healthy
    assert stack.metric("gateway_backend_up", pool="vllm", backend="vllm-0", engine="sim") == 0
    await post(stack.base_url, chat(max_tokens=1))
    assert stack.sims["vllm-0"].stats.seen == 5  # no traffic once ejected


async def test_429_with_retry_after_is_passed_on(make_stack: StackFactory) -> None:
    stack = await make_stack(pools={"vllm": [sim_params(fault="status=429;retry_after=7")]})
    r = await post(stack.base_url, chat())
    assert r.status_code == 429
    assert int(r.headers["retry-after"]) >= 7
    assert stack.total("gateway_requests_total", outcome="overloaded") == 1


async def test_400_is_not_retried_and_not_penalised(make_stack: StackFactory) -> None:
    stack = await make_stack(
        pools={"vllm": [sim_params(fault="status=400"), sim_params()]}, pool_vllm={"balancer": "first_healthy"}
    )
    r = await post(stack.base_url, chat())
    assert r.status_code == 400
    assert stack.sims["vllm-1"].stats.seen == 0
    assert stack.gateway.registry.by_name["vllm-0"].consecutive_failures == 0


async def test_501_not_supported_is_passed_on_and_never_ejects(make_stack: StackFactory) -> None:
    """llama-server answers /v1/embeddings with 501 unless started with --embeddings: the client gets
    that 501 in the engine's words, and no number of such requests takes the backend out of rotation."""
    stack = await make_stack(
        pools={"vllm": [sim_params("llamacpp", fault="status=501"), sim_params("llamacpp")]},
        pool_vllm={"balancer": "first_healthy"},
    )
    for _ in range(6):
        r = await post(stack.base_url, chat(max_tokens=1))
        assert r.status_code == 501
        assert error_of(r)["code"] == "not_supported"
    assert stack.sims["vllm-1"].stats.seen == 0  # not retried: every backend of a pool runs alike
    assert stack.gateway.registry.by_name["vllm-0"].healthy
    assert stack.gateway.registry.by_name["vllm-0"].consecutive_failures == 0


@pytest.mark.parametrize("body", ["html", "truncated", "empty"])
async def test_non_json_200_is_502(make_stack: StackFactory, body: str) -> None:
    stack = await make_stack(pools={"vllm": [sim_params(fault=f"status=502;body={body}")]})
    r = await post(stack.base_url, chat())
    assert r.status_code == 502
    error_of(r)


async def test_first_event_error_becomes_an_http_error(make_stack: StackFactory) -> None:
    stack = await make_stack()
    r = await post(stack.base_url, chat(stream=True), "first_event_error=1")
    assert r.status_code >= 400
    error_of(r)


async def test_connection_refused_fails_over(make_stack: StackFactory) -> None:
    stack = await make_stack(
        pools={"vllm": ["http://127.0.0.1:9", sim_params()]}, pool_vllm={"balancer": "first_healthy"}
    )
    # The closed port failed its startup health check; force it "healthy" to exercise failover.
    stack.gateway.health_state.set_health(stack.gateway.registry.by_name["vllm-0"], True)
    r = await post(stack.base_url, chat(max_tokens=1))
    assert r.status_code == 200 and r.headers["x-gateway-backend"] == "vllm-1"
    assert stack.total("gateway_upstream_errors_total", kind="connect") == 1


async def test_all_backends_down_is_a_fast_503(make_stack: StackFactory) -> None:
    stack = await make_stack(pools={"vllm": ["http://127.0.0.1:9"]})
    r = await post(stack.base_url, chat())
    assert r.status_code == 503 and "retry-after" in r.headers
    assert error_of(r)["type"] == "service_unavailable"
    async with httpx.AsyncClient() as client:
        assert (await client.get(stack.base_url + "/readyz")).status_code == 503
        assert (await client.get(stack.base_url + "/healthz")).status_code == 200


async def test_retry_storm_is_bounded_by_the_budget(make_stack: StackFactory) -> None:
    stack = await make_stack(
        pools={"vllm": [sim_params(fault="status=503")] * 3},
        retry={"budget_min": 0, "budget_ratio": 0.2, "max_attempts": 3},
        health={"unhealthy_after": 1000},
    )
    import asyncio

    replies = await asyncio.gather(*(post(stack.base_url, chat()) for _ in range(30)))
    assert all(r.status_code == 503 for r in replies)
    # Generation attempts only: the exact count before a gateway-set budget is not an attempt.
    attempts = sum(1 for s in stack.sims.values() for r in s.stats.recent if r.path == "/v1/chat/completions")
    assert attempts <= 30 * 1.2 + 1
    assert stack.total("gateway_retry_budget_exhausted_total") > 0


async def test_garbage_sse_is_relayed_and_accounted(make_stack: StackFactory) -> None:
    stack = await make_stack()
    r = await post(stack.base_url, chat(stream=True, max_tokens=3), "garbage=1")
    assert r.status_code == 200
    assert sse_events(r.content)[-1] == "[DONE]"


async def test_a_gateway_bug_is_internal_error_not_an_upstream_failure(
    make_stack: StackFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = await make_stack()

    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug in the relay")

    # The answer's read, not the relay's own method: a compiled class's methods cannot be patched.
    monkeypatch.setattr(UpstreamResponse, "read", broken)
    r = await post(stack.base_url, chat())
    assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error"
    assert stack.total("gateway_requests_total", outcome="internal_error") == 1
    assert stack.total("gateway_requests_total", outcome="upstream_error_before_first_byte") == 0
    assert stack.gateway.registry.by_name["vllm-0"].consecutive_failures == 0
