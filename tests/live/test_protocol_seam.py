"""The protocol seam's translation hooks, end to end through the real pipeline: a toy translating
protocol (chat in, upper-cased chat out) served by a real uvicorn in front of a simulated engine.
What a Messages or Responses adapter relies on: target() picks the upstream path, encode() builds
the body, stream_transform() rewrites the stream, response_body() the answer, and the observer
still sees the engine's own events (TTFT, usage)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from gateway.app.build import GatewayApp
from gateway.pipeline.endpoint import CompletionEndpoint, Stages
from gateway.protocols.base import Inbound, SseObserver, StreamTransform, Target
from gateway.protocols.edits import Edits
from gateway.protocols.openai import OpenAIProtocol
from gateway.protocols.sse import StreamObserver
from tests.live.conftest import Stack, StackFactory, content_of, sse_events

pytestmark = pytest.mark.live

PATH = "/test/shout"


class Upper:
    """A StreamTransform: upper-cases the content of every event (it is fed whole events)."""

    def feed(self, chunk: bytes) -> bytes:
        out = []
        for event in chunk.split(b"\n\n"):
            if event.startswith(b"data: {"):
                obj = json.loads(event[6:])
                for choice in obj.get("choices", []):
                    delta = choice.get("delta") or {}
                    if isinstance(delta.get("content"), str):
                        delta["content"] = delta["content"].upper()
                event = b"data: " + json.dumps(obj).encode()
            if event:
                out.append(event + b"\n\n")
        return b"".join(out)

    def finish(self) -> bytes:
        return b""


class Shout(OpenAIProtocol):
    """Chat in, chat upstream on the engine's own path, the answer upper-cased on the way back."""

    def target(self, inbound: Inbound, engine: str) -> Target:
        return Target("/v1/chat/completions", native=False)

    def encode(self, inbound: Inbound, edits: Edits, model: str | None, target: Target) -> bytes:
        body = {**inbound.body, "model": model or inbound.model, "x_translated": True}
        return json.dumps(body).encode()

    def observer(self, inbound: Inbound, edits: Edits, target: Target) -> SseObserver:
        return StreamObserver(strip_usage=False, whole_events=True)

    def stream_transform(self, inbound: Inbound, target: Target) -> StreamTransform | None:
        return Upper()

    def response_body(self, inbound: Inbound, raw: bytes, parsed: Any, target: Target) -> bytes:
        parsed["choices"][0]["message"]["content"] = parsed["choices"][0]["message"]["content"].upper()
        return json.dumps(parsed).encode()


def mount(stack: Stack) -> None:
    app = stack.server.config.loaded_app
    while not isinstance(app, GatewayApp):
        app = app.app  # uvicorn's own middleware wraps the app
    gw = app.gateway
    stages = Stages(
        gw.config, gw.access, gw.router, gw.caps, gw.admission, gw.attempts, gw.relay, gw.accounting, gw.lifecycle
    )
    endpoint = CompletionEndpoint(Shout("chat", PATH), stages)
    app._served.fast[PATH] = endpoint


async def test_a_translating_protocol_goes_through_the_seam(make_stack: StackFactory) -> None:
    stack = await make_stack()
    mount(stack)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}
    async with httpx.AsyncClient(timeout=10) as client:
        plain = await client.post(stack.base_url + PATH, json=body)
        streamed = await client.post(
            stack.base_url + PATH, json={**body, "stream": True, "stream_options": {"include_usage": True}}
        )
    assert plain.status_code == 200 and plain.headers["x-gateway-backend"] == "vllm-0"
    text = plain.json()["choices"][0]["message"]["content"]
    assert any(c.isalpha() for c in text) and text == text.upper()
    assert streamed.status_code == 200
    events = sse_events(streamed.content)
    assert events[-1] == "[DONE]"
    shouted = content_of(events)
    assert any(c.isalpha() for c in shouted) and shouted == shouted.upper()
    recent = list(stack.sims["vllm-0"].stats.recent)
    assert [r.path for r in recent] == ["/v1/chat/completions"] * 2
    assert all(r.body["x_translated"] for r in recent)  # encode() made the upstream body
    # The observer saw the engine's own events: a first token and the engine's usage.
    assert stack.total("gateway_time_to_first_token_seconds_count") == 1
    assert stack.total("gateway_output_tokens_total", source="usage") >= 2
