"""Details of the real engines' recordings that a one-shot replay cannot show: vLLM's latency histograms
(measured in model time), its uncounted client aborts, its info metric's labels, and a busy llama.cpp
slot's task fields."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from engines.sim.metrics import exposition
from engines.sim.model import BatchCore, SimParams, SimSequence
from tests.sim.sim_helpers import CHAT_PATH, SimFactory, chat_body, metric

pytestmark = pytest.mark.live

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def run(core: BatchCore, steps: int | None = None) -> None:
    while core.has_work and steps != 0:
        core.begin_step()
        core.end_step()
        steps = None if steps is None else steps - 1


def test_latency_histograms_in_model_time() -> None:
    # One slot, 10 ms per step, prefill too fast to matter: a runs at once, b queues behind it.
    core = BatchCore(SimParams(base_step_s=0.01, per_seq_step_s=0.0, max_batch=1, prefill_tokens_per_s=1e12))
    a, b = SimSequence(prompt_tokens=8, max_tokens=3), SimSequence(prompt_tokens=8, max_tokens=2)
    core.submit(a)
    core.submit(b)
    run(core)
    lat = core.counters.latency
    # a: first token at 0.01 s, done at 0.03 s; b: admitted at 0.03 s, first token 0.04 s, done 0.05 s.
    assert lat.ttft.count == 2 and lat.ttft.sum == pytest.approx(0.01 + 0.04)
    assert lat.inter_token.count == 3 and lat.inter_token.sum == pytest.approx(0.03)
    assert lat.e2e.count == 2 and lat.e2e.sum == pytest.approx(0.03 + 0.05)
    assert lat.queue.count == 2 and lat.queue.sum == pytest.approx(0.03)
    assert core.clock == pytest.approx(0.05)

    # An aborted request that got its first token counts in TTFT only, as in vLLM.
    c = SimSequence(prompt_tokens=8, max_tokens=10)
    core.submit(c)
    run(core, steps=2)
    core.abort(c)
    assert (lat.ttft.count, lat.inter_token.count, lat.e2e.count, lat.queue.count) == (3, 4, 2, 2)


def test_vllm_exposition_histograms_aborts_and_info_labels() -> None:
    core = BatchCore(SimParams(base_step_s=0.01, per_seq_step_s=0.0, block_size=128, kv_budget_tokens=131072,
                               context_limit=1024))  # fmt: skip
    done, left = SimSequence(prompt_tokens=8, max_tokens=2), SimSequence(prompt_tokens=8, max_tokens=50)
    core.submit(done)
    core.submit(left)
    run(core, steps=2)
    core.abort(left)  # a client that went away
    text = exposition(core)
    assert core.counters.finished["abort"] == 1
    assert metric(text, "vllm:request_success_total") == 1  # vLLM 0.32 does not count client aborts
    assert 'vllm:request_success_total{engine="0",finished_reason="abort",model_name="tiny"} 0' in text
    buckets = [ln for ln in text.splitlines() if ln.startswith("vllm:time_to_first_token_seconds_bucket")]
    counts = [int(ln.rsplit(" ", 1)[1]) for ln in buckets]
    assert counts == sorted(counts) and counts[-1] == 2 and 'le="+Inf"' in buckets[-1]
    assert metric(text, "vllm:time_to_first_token_seconds_count") == 2
    assert metric(text, "vllm:e2e_request_latency_seconds_count") == 1
    info = next(ln for ln in text.splitlines() if ln.startswith("vllm:cache_config_info{"))
    for label in ('block_size="128"', 'num_gpu_blocks="1024"', 'kv_cache_size_tokens="131072"', 'engine="0"'):
        assert label in info
    assert "model_name" not in info


async def test_busy_llamacpp_slot_has_the_recorded_task_fields(make_sim: SimFactory) -> None:
    recorded = json.loads((FIXTURES / "llamacpp" / "slots_busy.json").read_text())["body"]
    real_idle = next(s for s in recorded if not s["is_processing"])
    real_busy = next(s for s in recorded if s["is_processing"])
    sim = await make_sim("llamacpp", max_batch=2, base_step_s=0.02)
    body = chat_body(max_tokens=50, stream=True)
    async with httpx.AsyncClient(base_url=sim.base_url, timeout=10) as c, c.stream("POST", CHAT_PATH, json=body) as r:
        async for _ in r.aiter_lines():
            break
        busy, idle = (await c.get("/slots")).json()
    assert idle.keys() == real_idle.keys()
    # The sim leaves out "params" (some forty sampling settings); every other key is there.
    assert busy.keys() == real_busy.keys() - {"params"}
    assert busy["next_token"][0].keys() == real_busy["next_token"][0].keys()
    assert busy["is_processing"] and busy["n_prompt_tokens"] == busy["n_prompt_tokens_processed"] > 0
    assert busy["next_token"][0]["n_decoded"] + busy["next_token"][0]["n_remain"] == 50


async def test_vllm_version(make_sim: SimFactory) -> None:
    sim = await make_sim("vllm")
    async with httpx.AsyncClient(base_url=sim.base_url) as c:
        assert (await c.get("/version")).json() == {"version": "0.32.0+sim"}
    sglang = await make_sim("sglang")
    async with httpx.AsyncClient(base_url=sglang.base_url) as c:
        assert (await c.get("/version")).status_code == 404
