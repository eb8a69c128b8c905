"""prefix_affinity keeps conversations where their prefix is cached, on two REAL vLLM CPU replicas with
prefix caching: the CI-sized version of benchmarks/affinity.py.

Nine interleaved 3-turn conversations (~440-token openings, ~70 tokens more each turn) go through the
gateway once with `prefix_affinity` and once with `round_robin`, one request at a time, with each
replica's prefix cache reset in between. Each replica's KV budget is ~0.6x the workload's distinct
prefix tokens, so placement matters: a replica cannot hold every conversation, only its share.

One request at a time makes the hit rate a count of placement alone (no load-bound spills, no timing).
An odd number of conversations makes round_robin alternate each conversation between the replicas,
which is what a balancer that ignores prefixes does; if prefix_affinity degraded to it, its hit rate
would fall to round_robin's (~0) and this test fails.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from benchmarks.affinity import Workload, kv_cache_info, run_gateway_policy

pytestmark = pytest.mark.slow

WORKLOAD = Workload(conversations=9, turns=3)
KV_TOKENS = 24 * 128  # 24 blocks: ~0.6x the ~4,900 distinct prefix tokens (checked below from usage)
BLOCK = 128  # vLLM's CPU block size, checked below from its cache_config_info
FLOOR = 0.3


@pytest.fixture
def replica_pair(engine_launcher: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")  # POST /reset_prefix_cache between the policies
    with ThreadPoolExecutor(2) as pool:  # ~35 s each; one core each, so they start side by side
        futures = [
            pool.submit(
                engine_launcher,
                "vllm",
                max_model_len=2048,
                max_num_seqs=4,
                kv_cache_memory_bytes=KV_TOKENS * 512,
                cpu_omp_threads_bind=str(i),
            )
            for i in range(2)
        ]
        return [f.result() for f in futures]


def test_prefix_affinity_beats_round_robin_on_real_vllm(replica_pair: list[Any]) -> None:
    for replica in replica_pair:
        info = kv_cache_info(replica.metrics_url)
        assert info.get("kv_cache_size_tokens") == str(KV_TOKENS), info
        assert info.get("block_size") == str(BLOCK), info
        assert info.get("enable_prefix_caching") == "True", info

    start = time.monotonic()
    pa = run_gateway_policy("prefix_affinity", replica_pair, WORKLOAD, concurrency=1)
    rr = run_gateway_policy("round_robin", replica_pair, WORKLOAD, concurrency=1)
    elapsed = time.monotonic() - start
    summary = (
        f"prefix_affinity {pa.hit_rate:.3f} (per replica {pa.per_backend}, conversations "
        f"{pa.conversations_per_backend}, switches {pa.switches}); round_robin {rr.hit_rate:.3f} "
        f"(switches {rr.switches}); {elapsed:.0f} s"
    )
    print(summary)

    for r in (pa, rr):
        assert r.errors == 0 and r.requests == WORKLOAD.conversations * WORKLOAD.turns, summary
        # the engine's counters and the responses' usage agree on what was cached
        assert r.queries == r.usage_prompt and r.hits == r.usage_cached, (r.hits, r.queries, r.usage_cached)
    distinct = sum(pa.final_prompt_tokens)
    assert 0.4 * distinct <= KV_TOKENS <= 0.8 * distinct, f"KV budget {KV_TOKENS} vs ~{distinct} distinct tokens"

    # Placement: each conversation stays on one replica, and the conversations spread over both.
    assert pa.switches == 0, summary
    assert min(pa.conversations_per_backend.values()) >= 1, summary
    assert rr.switches >= WORKLOAD.conversations, summary  # the control really alternates
    # The cache pays off only under prefix_affinity.
    assert pa.hit_rate >= FLOOR, summary
    assert pa.hit_rate >= 2 * rr.hit_rate, summary
