"""The simulator's parts without sockets: parameters and presets, prefix cache, batching core, what-if
runs, tokenizer, fault grammar, and the real-time engine driven in process."""

from __future__ import annotations

import asyncio
import math
import statistics

import pytest

from engines.sim.cache import PrefixCache, block_hashes
from engines.sim.engine import SimEngine
from engines.sim.faults import Fault, FaultSpecError, parse_fault
from engines.sim.model import BatchCore, SimParams, SimSequence
from engines.sim.text import (
    IM_END,
    IM_START,
    count_tokens,
    embedding,
    filler_text,
    render_chat,
    tokenize,
)
from engines.sim.whatif import WhatIfRequest, least_running, most_cached, run_whatif

pytestmark = pytest.mark.unit


def seq(prompt: int = 8, max_tokens: int = 4, ids: list[int] | None = None, bs: int = 16) -> SimSequence:
    ids = ids if ids is not None else list(range(prompt))
    return SimSequence(prompt_tokens=len(ids), max_tokens=max_tokens, hashes=block_hashes(ids, bs))


def run_to_end(core: BatchCore) -> float:
    total = 0.0
    while core.has_work:
        total += core.begin_step()
        core.end_step()
    return total


# -- parameters -------------------------------------------------------------------------------------------
def test_seed_preset_matches_the_measured_setup() -> None:
    p = SimParams.preset("seed")
    assert 1 / p.step_time(1) == pytest.approx(11.3, rel=1e-9)
    assert 1 / p.step_time(32) == pytest.approx(5.6, rel=1e-9)
    assert 32 / p.step_time(32) == pytest.approx(179.9, rel=0.01)


def test_presets_and_overrides() -> None:
    assert SimParams.preset("fast").base_step_s <= 0.002
    assert SimParams.preset("demo").base_step_s == pytest.approx(0.02)
    p = SimParams.preset("seed", flavour="llamacpp", max_batch=4)
    assert (p.flavour, p.max_batch) == ("llamacpp", 4)
    with pytest.raises(ValueError, match="unknown sim preset"):
        SimParams.preset("nope")
    with pytest.raises(ValueError, match="max_batch"):
        SimParams(max_batch=0)
    with pytest.raises(ValueError, match="flavour"):
        SimParams(flavour="trtllm")  # type: ignore[arg-type]


# -- prefix cache -----------------------------------------------------------------------------------------
def test_block_hashes_are_chained_and_cover_full_blocks_only() -> None:
    a = block_hashes(list(range(40)), 16)
    assert len(a) == 2  # 8 trailing tokens do not make a block
    b = block_hashes([*range(16), 99, *range(17, 40)], 16)
    assert a[0] == b[0] and a[1] != b[1]
    c = block_hashes([99, *range(1, 40)], 16)  # a change in block 0 changes every later hash
    assert c[0] != a[0] and c[1] != a[1]


def test_prefix_cache_evicts_least_recent_unpinned_only() -> None:
    cache = PrefixCache()
    cache.pin([1, 2])
    cache.pin([3])
    cache.unpin([1, 2])
    cache.pin([1])  # touch 1 again: 2 is now the least recent unpinned block
    cache.unpin([1])
    cache.trim(1)
    assert cache.match([1]) == 1 and cache.match([2]) == 0 and cache.match([3]) == 1
    cache.trim(0)
    assert cache.match([1]) == 0 and cache.match([3]) == 1  # 3 is pinned
    assert cache.match([3, 4]) == 1


# -- batching core ----------------------------------------------------------------------------------------
def test_step_time_includes_uncached_prefill_and_batch_size() -> None:
    p = SimParams(base_step_s=0.1, per_seq_step_s=0.01, prefill_tokens_per_s=100.0)
    core = BatchCore(p)
    core.submit(seq(prompt=50))
    core.submit(seq(prompt=30, ids=list(range(100, 130))))
    assert core.begin_step() == pytest.approx(0.1 + 0.01 + 80 / 100)
    core.end_step()
    assert core.begin_step() == pytest.approx(0.11)  # decode only


def test_prefix_hit_skips_prefill_and_counts_cached_tokens() -> None:
    p = SimParams(base_step_s=0.1, per_seq_step_s=0.0, prefill_tokens_per_s=100.0, block_size=16)
    core = BatchCore(p)
    ids = list(range(70))
    first = seq(ids=ids)
    core.submit(first)
    assert core.begin_step() == pytest.approx(0.1 + 0.7)
    run_to_end(core)
    again = seq(ids=ids)
    core.submit(again)
    assert core.begin_step() == pytest.approx(0.1 + (70 - 64) / 100)
    assert again.cached_tokens == 64
    assert (core.counters.prefix_queries, core.counters.prefix_hits) == (140, 64)
    run_to_end(core)
    exact = seq(ids=list(range(64)))  # fully cached prompt: the last block is recomputed
    core.submit(exact)
    core.begin_step()
    assert exact.cached_tokens == 48


def test_max_batch_and_kv_budget_make_requests_wait_fifo() -> None:
    core = BatchCore(SimParams(max_batch=2, kv_budget_tokens=100))
    a, b, c = seq(prompt=20, max_tokens=20), seq(prompt=20, max_tokens=20), seq(prompt=10, max_tokens=5)
    for s in (a, b, c):
        core.submit(s)
    core.begin_step()
    assert [s.state for s in (a, b, c)] == ["running", "running", "waiting"]
    big = seq(prompt=50, max_tokens=30)
    core2 = BatchCore(SimParams(max_batch=8, kv_budget_tokens=100))
    for s in (a2 := seq(prompt=20, max_tokens=20), big, small := seq(prompt=5, max_tokens=1)):
        core2.submit(s)
    core2.begin_step()
    # 40 + 80 > 100: the big one waits, and the small one behind it waits too (FIFO)
    assert (a2.state, big.state, small.state) == ("running", "waiting", "waiting")
    assert len(core2.waiting) == 2
    run_to_end(core2)
    assert big.state == small.state == "finished"


def test_a_lone_request_larger_than_the_budget_still_runs() -> None:
    core = BatchCore(SimParams(kv_budget_tokens=10))
    s = seq(prompt=20, max_tokens=5)
    core.submit(s)
    run_to_end(core)
    assert s.state == "finished" and s.generated == 5


def test_abort_frees_slot_and_reservation_at_once() -> None:
    core = BatchCore(SimParams(max_batch=1))
    a, b = seq(max_tokens=100), seq(max_tokens=2)
    core.submit(a)
    core.submit(b)
    core.begin_step()
    core.end_step()
    assert core.abort(a) and a.state == "aborted" and a.finish_reason == "abort"
    assert not core.abort(a)
    assert a.generated == 1
    core.begin_step()
    assert b.state == "running"
    assert core.counters.finished["abort"] == 1


def test_finish_reasons_and_forced_token_counts() -> None:
    core = BatchCore(SimParams())
    by_length = seq(max_tokens=3)
    forced = SimSequence(prompt_tokens=4, max_tokens=10, stop_after=2)
    capped = SimSequence(prompt_tokens=4, max_tokens=2, stop_after=5)
    for s in (by_length, forced, capped):
        core.submit(s)
    run_to_end(core)
    assert (by_length.generated, by_length.finish_reason) == (3, "length")
    assert (forced.generated, forced.finish_reason) == (2, "stop")
    assert (capped.generated, capped.finish_reason) == (2, "length")
    assert core.counters.generation_tokens == 7
    assert core.kv_used_tokens == 0


def test_kv_usage_counts_prompt_and_generated_tokens() -> None:
    core = BatchCore(SimParams(kv_budget_tokens=100))
    core.submit(seq(prompt=30, max_tokens=10))
    core.begin_step()
    core.end_step()
    core.begin_step()
    core.end_step()
    assert core.kv_used_tokens == 32 and core.kv_usage == pytest.approx(0.32)


async def test_realtime_engine_in_process_without_sockets() -> None:
    async with SimEngine(SimParams(base_step_s=0.001)) as engine:
        done = await engine.generate(SimSequence(prompt_tokens=10, max_tokens=5))
        assert (done.state, done.generated, done.finish_reason) == ("finished", 5, "length")
        task = asyncio.create_task(engine.generate(SimSequence(prompt_tokens=10, max_tokens=10_000)))
        while not engine.core.running:
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not engine.core.running and engine.core.counters.finished["abort"] == 1


# -- what-if ----------------------------------------------------------------------------------------------
def test_whatif_reproduces_the_seed_calibration() -> None:
    p = SimParams.preset("seed")
    one = run_whatif([p], [WhatIfRequest(0.0, list(range(16)), 64)], least_running)
    assert one[0].tokens_per_s == pytest.approx(11.3, rel=0.01)
    reqs = [WhatIfRequest(0.0, list(range(i * 16, i * 16 + 16)), 64) for i in range(32)]
    many = run_whatif([p], reqs, least_running)
    assert statistics.median(r.tokens_per_s for r in many) == pytest.approx(5.6, rel=0.01)
    aggregate = 32 * 64 / max(r.finish_s for r in many)
    assert aggregate == pytest.approx(179.9, rel=0.1)


def test_whatif_compares_policies_in_virtual_time() -> None:
    p = SimParams.preset("seed", prefill_tokens_per_s=500.0)
    system = list(range(2000, 2512))  # a 512-token shared prefix: 1 s of prefill when not cached
    reqs = [WhatIfRequest(i * 2.0, [*system, i], 4) for i in range(8)]
    spread = run_whatif([p] * 4, reqs, least_running)
    sticky = run_whatif([p] * 4, reqs, most_cached)
    assert [r.request for r in sticky] == reqs
    assert {r.backend for r in sticky} == {0}
    assert len({r.backend for r in spread}) == 1  # idle backends: least_running also picks 0 on ties
    assert statistics.mean(r.ttft_s for r in sticky[1:]) < 0.2
    assert sticky[0].ttft_s > 1.0
    assert all(not math.isnan(r.finish_s) for r in spread)


# -- tokenizer --------------------------------------------------------------------------------------------
def test_tokenizer_rule() -> None:
    assert len(tokenize("abcd")) == 1
    assert len(tokenize("abcde")) == 2
    assert len(tokenize("é")) == 1 and len(tokenize("ééé")) == 2  # 6 bytes
    assert tokenize(IM_START + IM_END) == [1, 2]
    text = f"{IM_START}user\nhello there{IM_END}\n"
    assert len(tokenize(text)) == count_tokens(text) == 1 + 4 + 1 + 1  # "user\nhello there" is 16 bytes
    assert tokenize("same text") == tokenize("same text")


def test_chat_rendering_is_prefix_stable_and_counts_tools() -> None:
    one = [{"role": "system", "content": "s" * 64}, {"role": "user", "content": "hi"}]
    two = [*one, {"role": "assistant", "content": "yo"}, {"role": "user", "content": "more"}]
    a = tokenize(render_chat(one, add_generation_prompt=False))
    b = tokenize(render_chat(two))
    assert b[: len(a)] == a
    assert render_chat([{"role": "user", "content": [{"type": "text", "text": "x"}]}]).endswith(
        f"{IM_START}assistant\n"
    )
    with_tools = render_chat(one, tools=[{"type": "function", "function": {"name": "f"}}])
    assert count_tokens(with_tools) > count_tokens(render_chat(one))
    with pytest.raises(ValueError):
        render_chat([{"content": "no role"}])


def test_filler_and_embeddings_are_deterministic() -> None:
    assert filler_text(3) == " lorem ipsum dolor"
    assert "é" not in filler_text(20) and "é" in filler_text(5, accented=True)
    v = embedding("x")
    assert v == embedding("x") != embedding("y")
    assert sum(x * x for x in v) == pytest.approx(1.0, abs=1e-4)


# -- fault grammar ----------------------------------------------------------------------------------------
def test_fault_grammar() -> None:
    f = parse_fault("headers_delay=0.5; die_after=3;die=rst ;status=503;body=html;retry_after=7;split=1;never=1")
    assert (f.headers_delay, f.die_after, f.die, f.status, f.body) == (0.5, 3, "rst", 503, "html")
    assert (f.retry_after_header, f.split, f.accented, f.never) == ("7", 1, True, True)
    assert parse_fault("") == Fault()
    assert parse_fault("retry_after=1.5").retry_after_header == "1.5"
    base = parse_fault("chunk_delay=0.1;tokens=5")
    merged = parse_fault("tokens=2;garbage=1", base)
    assert (merged.chunk_delay, merged.tokens, merged.garbage) == (0.1, 2, True)


@pytest.mark.parametrize(
    "spec",
    ["nope=1", "status=99", "status=600", "die=kill", "body=xml", "split=0", "never=2", "chunk_delay=-1",
     "headers_delay=nan", "tokens=x", "tokens=0", "die_after=-2", "status"],
)  # fmt: skip
def test_fault_grammar_rejects(spec: str) -> None:
    with pytest.raises(FaultSpecError):
        parse_fault(spec)
