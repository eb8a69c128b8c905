"""TensorRT-LLM (`trtllm-serve`): its table."""

from __future__ import annotations

from engines.base import LaunchSpec
from engines.promtext import LoadTable, Ratio
from engines.table import TableAdapter, cap_flag


def _trtllm_launch(spec: LaunchSpec) -> list[str]:
    return [
        "trtllm-serve", spec.model, "--host", spec.host, "--port", str(spec.port),
        *cap_flag("--max_seq_len", spec.max_context_tokens),
        "--max_batch_size", str(spec.parallel),
    ]  # fmt: skip


# trtllm-serve's /metrics is JSON iteration stats; the Prometheus text is at /prometheus/metrics, under
# "trtllm_" (Dynamo re-exports it as "trtllm:"). Iteration stats need enable_iter_perf_stats.
_TRT = ("trtllm_", "trtllm:")


def _trt(name: str) -> tuple[str, ...]:
    return tuple(prefix + name for prefix in _TRT)


ADAPTER = TableAdapter(
    kind="trtllm",
    health_path="/health",
    metrics_path="/prometheus/metrics",
    load=LoadTable(
        running=_trt("num_requests_running"),
        waiting=_trt("num_requests_waiting"),
        kv_usage=_trt("kv_cache_utilization"),
        # Blocks reused vs missed, cumulative: hits / (hits + misses).
        hit_ratios=tuple(
            Ratio(f"{p}kv_cache_reused_blocks_total", f"{p}kv_cache_missed_blocks_total", False) for p in _TRT
        ),
        hit_rate=_trt("kv_cache_hit_rate"),
    ),
    launch=_trtllm_launch,
)
