"""The adapter of `engine: sim` backends' metrics (the simulator itself is engines/sim/, which imports none of this)."""

from __future__ import annotations

from engines import llamacpp, sglang, vllm
from engines.table import TableAdapter

# The simulator imitates a vLLM, SGLang or llama.cpp flavour, so it accepts all their names. It is
# started in-process (tests, `gateway demo`), so there is nothing to launch.
ADAPTER = TableAdapter(
    kind="sim",
    health_path="/health",
    metrics_path="/metrics",
    load=vllm.LOAD.merge(sglang.LOAD).merge(llamacpp.LOAD),
    # Every flavour's real engine serves Messages natively, and so does the simulator (engines/sim/messages.py).
    native_apis=frozenset({"messages", "count_tokens"}),
)
