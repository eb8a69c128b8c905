"""Token ids for the kv_events match, through a real gateway in front of two simulated vLLMs (the
simulator answers POST /tokenize; its KV-event sockets are never bound: the match needs the ids,
not the events): a conversation's first turn is routed with none, while its ids and its system
prompt's are asked in the background (with the pool's tokenizer: encoded before routing); its next
turn is matched from the first turn's ids (with the tokenizer: encoded from them);
the same state sent again needs no call; one prompt is asked once however many send it; the calls
take the engines in turn."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from engines.sim.server import SimServer
from gateway.app.instance import Gateway
from gateway.config_loader import parse_config
from gateway.pipeline.chat_tokenizer import ChatTokenizer
from gateway.pipeline.prompt_tokens import INLINE_CHARS
from gateway.pipeline.token_memo import Cut, message_keys
from gateway.serving.server import start
from tests.engines.servers import free_port
from tests.live.conftest import sim_params
from tests.unit.model_files import write_model

pytestmark = pytest.mark.live

TURN1 = [
    {"role": "system", "content": "You answer questions about garden tools. " * 20},
    {"role": "user", "content": "Which rake?"},
]
TURN2 = [*TURN1, {"role": "assistant", "content": "The leaf rake."}, {"role": "user", "content": "And for gravel?"}]


@pytest.fixture
async def stack() -> AsyncIterator[tuple[str, Gateway, list[SimServer]]]:
    async with serve() as running:
        yield running


@pytest.fixture
async def tokenized(tmp_path: Path) -> AsyncIterator[tuple[str, Gateway, list[SimServer]]]:
    """The pool names a tokenizer, whose ids are not the simulator's (those are hashes of the text)."""
    async with serve(str(write_model(tmp_path))) as running:
        yield running


@contextlib.asynccontextmanager
async def serve(
    tokenizer: str | None = None, backends: int = 2, **params: Any
) -> AsyncIterator[tuple[str, Gateway, list[SimServer]]]:
    sims = [SimServer(sim_params(**params)) for _ in range(backends)]
    for sim in sims:
        await sim.start()
    entries = [
        {
            "url": s.base_url,
            "name": f"r{i}",
            "model": "tiny",
            "kv_events": {"endpoint": f"tcp://127.0.0.1:{free_port()}"},
        }
        for i, s in enumerate(sims)
    ]
    pool: dict[str, Any] = {"engine": "sim", "flavour": "vllm", "balancer": "kv_events", "backends": entries}
    if tokenizer is not None:
        pool["tokenizer"] = tokenizer
    data: dict[str, Any] = {
        "pools": {"vllm": pool},
        "routes": [{"model": "tiny", "pools": ["vllm"]}],
        "health": {"interval_s": 60, "scrape_interval_s": 60},
    }
    running = await start(parse_config(data, env={}))
    try:
        yield running.base_url, running.gateway, sims
    finally:
        running.server.should_exit = True
        await running.task
        for sim in sims:
            await sim.stop()


def tokenize_calls(sims: list[SimServer]) -> list[int]:
    return [sum(r.path == "/tokenize" for r in sim.stats.recent) for sim in sims]


async def wait_for_calls(sims: list[SimServer], total: int) -> None:
    async with asyncio.timeout(5):
        while sum(tokenize_calls(sims)) < total:
            await asyncio.sleep(0.01)


def sources(gw: Gateway, names: tuple[str, ...] = ("none", "prefix", "remembered")) -> dict[str, float]:
    get = gw.metrics.registry.get_sample_value
    return {s: get("gateway_kv_events_prompt_ids_total", {"source": s}) or 0.0 for s in names}


async def test_a_next_turn_is_matched_from_the_remembered_first_turn(
    stack: tuple[str, Gateway, list[SimServer]],
) -> None:
    url, gw, sims = stack
    assert gw.tokens is not None
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:

        async def chat(messages: list[dict[str, str]]) -> None:
            r = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": messages, "max_tokens": 2})
            assert r.status_code == 200, r.text

        await chat(TURN1)
        assert sources(gw) == {"none": 1, "prefix": 0, "remembered": 0}
        await wait_for_calls(sims, 2)  # the whole turn, and its system prompt alone
        await chat(TURN2)  # routed from turn 1's ids; its own asked after
        assert sources(gw) == {"none": 1, "prefix": 1, "remembered": 0}
        await wait_for_calls(sims, 3)
        await chat(TURN2)
        await chat(TURN1)
        assert sources(gw) == {"none": 1, "prefix": 1, "remembered": 2}
        assert tokenize_calls(sims) == [2, 1]  # the engines in turn
        # A new conversation with the same system prompt is matched from the system prompt's ids.
        other = [TURN1[0], {"role": "user", "content": "Which spade?"}]
        await chat(other)
        assert sources(gw)["prefix"] == 2
        # What was remembered is the engine's own answer for those messages.
        body = {"model": "tiny", "messages": TURN2, "add_generation_prompt": True}
        direct = await client.post(sims[0].base_url + "/tokenize", json=body)
        keys = message_keys("tiny", TURN2)
        held = gw.tokens.memo.get(keys[-1])
        assert held is not None and list(held) == direct.json()["tokens"]


async def test_concurrent_first_turns_share_one_call(stack: tuple[str, Gateway, list[SimServer]]) -> None:
    url, gw, sims = stack
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        body = {"model": "tiny", "messages": TURN1, "max_tokens": 2}
        replies = await asyncio.gather(*(client.post("/v1/chat/completions", json=body) for _ in range(8)))
    assert all(r.status_code == 200 for r in replies)
    await wait_for_calls(sims, 2)
    await asyncio.sleep(0.05)
    assert sum(tokenize_calls(sims)) == 2  # the prompt and its system prompt, once each
    assert sources(gw)["none"] + sources(gw)["remembered"] == 8


async def test_the_pools_tokenizer_matches_before_routing_and_is_dropped_when_the_engine_disagrees(
    tokenized: tuple[str, Gateway, list[SimServer]], caplog: pytest.LogCaptureFixture
) -> None:
    url, gw, sims = tokenized
    assert gw.tokens is not None
    names = ("none", "prefix", "remembered", "local", "mismatch")
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:

        async def chat(messages: list[dict[str, str]]) -> None:
            r = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": messages, "max_tokens": 2})
            assert r.status_code == 200, r.text

        with caplog.at_level(logging.WARNING, logger="gateway.pipeline.prompt_tokens"):
            await chat(TURN1)  # encoded here, whole: no earlier turn, no hash guess
            seen = sources(gw, names)
            assert (seen["local"], seen["none"], seen["prefix"], seen["remembered"]) == (1, 0, 0, 0)
            # The first prompts are also asked of the engine (in the background, at a quiet moment):
            # the simulator's ids differ, so the tokenizer is turned off and what the memo held from
            # it is dropped.
            await wait_for_calls(sims, 1)
            async with asyncio.timeout(5):
                while sources(gw, names)["mismatch"] < 1:
                    await asyncio.sleep(0.01)
        assert len(gw.tokens.memo) == 0
        assert any("gave" in r.getMessage() and "asked of the engine" in r.getMessage() for r in caplog.records)
        assert "be brief" not in caplog.text and "garden" not in caplog.text  # no prompt text in the log
        await chat(TURN2)  # from the engine now, as with no tokenizer
        assert sources(gw, names)["local"] == 1 and sources(gw, names)["none"] == 1


async def test_a_long_prompt_is_encoded_in_a_thread_for_the_next_request(
    tokenized: tuple[str, Gateway, list[SimServer]],
) -> None:
    url, gw, sims = tokenized
    assert gw.tokens is not None
    long = [{"role": "system", "content": "garden " * (INLINE_CHARS // 7 + 1)}, {"role": "user", "content": "Which?"}]
    body = {"model": "tiny", "messages": long, "max_tokens": 2}
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    names = ("none", "local")
    assert sources(gw, names) == {"none": 1, "local": 0}  # not encoded before routing
    # Encoded off the loop by the tokenizer, and so is its system prompt alone: neither is asked of
    # the engine. The two /tokenize calls are the checks of those two encodings against the
    # engine's ids (which differ here).
    async with asyncio.timeout(5):
        while not sources(gw, ("mismatch",))["mismatch"]:
            await asyncio.sleep(0.005)
    await wait_for_calls(sims, 2)
    await asyncio.sleep(0.05)
    assert sum(tokenize_calls(sims)) == 2


TURN3 = [*TURN2, {"role": "assistant", "content": "The gravel rake."}, {"role": "user", "content": "Thanks."}]


async def test_a_next_turn_is_encoded_from_the_earlier_turns_ids(
    tokenized: tuple[str, Gateway, list[SimServer]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, gw, _ = tokenized
    assert gw.tokens is not None
    monkeypatch.setattr(gw.tokens, "_check", lambda *args: None)  # the simulator's ids are not the tokenizer's
    names = ("none", "local", "resumed", "resume_mismatch")
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        for turn in (TURN1, TURN2, TURN3):
            r = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": turn, "max_tokens": 2})
            assert r.status_code == 200, r.text
    # The first turn encoded whole, each next turn from the turn before it: all before routing.
    assert sources(gw, names) == {"none": 0, "local": 1, "resumed": 2, "resume_mismatch": 0}
    tokenizer = ChatTokenizer.load(str(Path(gw.config.pools["vllm"].tokenizer or "")))
    held = gw.tokens.memo.get(message_keys("tiny", TURN3)[-1])
    assert held is not None and list(held) == tokenizer.ids({"messages": TURN3})
    await settled(gw)  # the whole encodings that check the first resumed ones agreed
    assert sources(gw, names)["resume_mismatch"] == 0


async def test_a_tokenizer_that_encodes_pieces_differently_is_used_whole(
    tokenized: tuple[str, Gateway, list[SimServer]], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    url, gw, _ = tokenized
    assert gw.tokens is not None
    monkeypatch.setattr(gw.tokens, "_check", lambda *args: None)
    resume = ChatTokenizer.resume

    def off_by_one(
        self: ChatTokenizer, text: str, ids: Sequence[int], cut: Cut, release: bool = False, pieces: bool = False
    ) -> tuple[list[int], Cut | None] | None:
        got = resume(self, text, ids, cut, release, pieces)
        return ([*got[0], 0], got[1]) if got is not None else None

    monkeypatch.setattr(ChatTokenizer, "resume", off_by_one)
    names = ("local", "resumed", "resume_mismatch")
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:

        async def chat(messages: list[dict[str, str]]) -> None:
            r = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": messages, "max_tokens": 2})
            assert r.status_code == 200, r.text

        with caplog.at_level(logging.WARNING, logger="gateway.pipeline.prompt_tokens"):
            await chat(TURN1)
            await chat(TURN2)
            await settled(gw)
        assert sources(gw, names) == {"local": 1, "resumed": 1, "resume_mismatch": 1}
        assert len(gw.tokens.memo) == 0  # what the pieces gave is dropped
        assert any("in pieces" in r.getMessage() for r in caplog.records)
        await chat(TURN1)
        await chat(TURN2)  # whole now
    assert sources(gw, names) == {"local": 3, "resumed": 1, "resume_mismatch": 1}
    whole = ChatTokenizer.load(str(Path(gw.config.pools["vllm"].tokenizer or ""))).ids({"messages": TURN2})
    held = gw.tokens.memo.get(message_keys("tiny", TURN2)[-1])
    assert held is not None and list(held) == whole


async def settled(gw: Gateway) -> None:
    """Wait until the gateway's background token work is done."""
    assert gw.tokens is not None
    async with asyncio.timeout(5):
        while gw.tokens.busy():
            await asyncio.sleep(0.005)


async def test_the_tokenizers_check_waits_until_the_engine_has_nothing_in_flight(tmp_path: Path) -> None:
    """The check's tokenize call is not sent while the only engine streams the request it checks
    (a gateway's first prompts come in a burst that engine is taking in), and is sent after."""
    async with (
        serve(str(write_model(tmp_path)), backends=1, base_step_s=0.05) as (url, gw, sims),
        httpx.AsyncClient(base_url=url, timeout=10) as client,
    ):
        body = {"model": "tiny", "messages": TURN1, "max_tokens": 40, "ignore_eos": True}
        reply = asyncio.create_task(client.post("/v1/chat/completions", json=body))  # ~2 s of tokens
        async with asyncio.timeout(5):
            while not sources(gw, ("local",))["local"]:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.6)  # a few of the check's looks for a quiet moment
        assert not reply.done() and tokenize_calls(sims) == [0]
        assert (await reply).status_code == 200
        await wait_for_calls(sims, 1)  # the engine is quiet now: checked


async def test_a_backend_without_tokenize_is_asked_once_then_rests(caplog: pytest.LogCaptureFixture) -> None:
    """An engine that answers 404 to /tokenize is not asked again for every new prompt: each backend
    is asked once, then rests (one warning each), and the requests are still served."""
    async with serve() as (url, gw, sims), httpx.AsyncClient(base_url=url, timeout=10) as client:
        for sim in sims:
            del sim.api.routes[("POST", "/tokenize")]  # the simulator answers an unknown path 404
        caplog.set_level(logging.WARNING, logger="gateway.pipeline.engine_tokens")
        for i in range(12):
            chat = [{"role": "user", "content": f"Question number {i} about rakes?"}]
            r = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": chat, "max_tokens": 2})
            assert r.status_code == 200, r.text
            await settled(gw)
        assert tokenize_calls(sims) == [1, 1]
        assert sources(gw, ("none",)) == {"none": 12}
        warned = [r.getMessage() for r in caplog.records if "answered 404 to POST /tokenize" in r.getMessage()]
        assert len(warned) == 2 and "not asked for 60 s" in warned[0]
