"""Prometheus text exposition of the simulator, under each flavour's own metric names.

Written by hand (no prometheus_client): a scrape is a few string joins over the batching core's counters.
vLLM's is a subset of vLLM 0.32's (tests/fixtures/vllm/metrics.txt): every name the gateway reads or
ENGINES.md lists, and a few more the model has figures for, with the same types, help and label names.
"""

from __future__ import annotations

from engines.sim.latency import Histogram
from engines.sim.model import BatchCore

Labels = dict[str, str]
# (name, type, help, value, or [(extra labels, value)], or a histogram)
_Sample = tuple[str, str, str, float | list[tuple[Labels, float]] | Histogram]

# vLLM 0.32's cache_config_info labels as recorded (CPU, default settings); exposition() fills in the sizes.
_VLLM_CACHE_CONFIG = {
    "_block_size_resolved": "True", "cache_dtype": "auto", "cache_hit_alignment_tokens": "None",
    "enable_mamba_shared_prefix_checkpoint": "False", "enable_prefix_caching": "True",
    "gpu_memory_utilization": "0.92", "hash_block_size": "None", "is_attention_free": "False",
    "kv_cache_dtype_skip_layers": "[]", "kv_cache_layout": "None", "kv_offloading_backend": "native",
    "kv_offloading_size": "None", "kv_sharing_fast_prefill": "False", "mamba_block_size": "None",
    "mamba_cache_dtype": "auto", "mamba_cache_mode": "none", "mamba_page_size_padded": "None",
    "mamba_ssm_cache_dtype": "float32", "num_cpu_blocks": "None", "num_gpu_blocks_override": "None",
    "prefix_cache_retention_interval": "0", "prefix_caching_hash_algo": "sha256", "prefix_match_unit": "None",
    "replayssm_buffer_len": "16", "skip_page_size_padded": "None", "sliding_window": "None",
    "swa_bounded_replay": "True", "use_kda_recoverssm": "False", "use_replayssm": "False",
    "user_specified_block_size": "False",
}  # fmt: skip


def exposition(core: BatchCore) -> str:
    flavour = core.params.flavour
    if flavour == "vllm":
        return _render(_vllm(core), {"model_name": core.params.model, "engine": "0"})
    if flavour == "sglang":
        return _render(_sglang(core), {"model_name": core.params.model})
    return _render(_llamacpp(core), {})


def _vllm_cache_config(core: BatchCore) -> Labels:
    p = core.params
    blocks = p.kv_budget_tokens // p.block_size
    sizes = {
        "block_size": str(p.block_size),
        "effective_attention_block_size": str(p.block_size),
        "kv_cache_size_tokens": str(blocks * p.block_size),
        "num_gpu_blocks": str(blocks),
        # How many max-length requests fit; the memory size is only set by a flag the simulator lacks.
        "kv_cache_max_concurrency": repr(blocks * p.block_size / p.context_limit),
        "kv_cache_memory_bytes": "None",
        "engine": "0",
    }
    return _VLLM_CACHE_CONFIG | sizes


def _vllm(core: BatchCore) -> list[_Sample]:
    c, lat = core.counters, core.counters.latency
    # vLLM 0.32 does not count a client's disconnect as finished_reason="abort" (it stays 0: see
    # tests/fixtures/README.md), and the simulator has no other kind of abort.
    finished = {**c.finished, "abort": 0, "error": 0, "repetition": 0}
    success = [({"finished_reason": k}, float(v)) for k, v in finished.items()]
    return [
        ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
         len(core.running)),
        ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
         len(core.waiting)),
        ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", core.kv_usage),
        ("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried "
         "tokens.", c.prefix_queries),
        ("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.",
         c.prefix_hits),
        ("vllm:prompt_tokens_cached_total", "counter", "Number of cached prompt tokens (local + external).",
         c.prefix_hits),
        ("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.", 0),
        ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", c.prompt_tokens),
        ("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
         c.generation_tokens),
        ("vllm:request_success_total", "counter", "Count of successfully processed requests.", success),
        ("vllm:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.",
         lat.ttft),
        ("vllm:inter_token_latency_seconds", "histogram", "Histogram of inter-token latency in seconds.",
         lat.inter_token),
        ("vllm:e2e_request_latency_seconds", "histogram", "Histogram of e2e request latency in seconds.",
         lat.e2e),
        ("vllm:request_queue_time_seconds", "histogram", "Histogram of time spent in WAITING phase for request.",
         lat.queue),
        ("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig",
         [(_vllm_cache_config(core), 1.0)]),
    ]  # fmt: skip


def _sglang(core: BatchCore) -> list[_Sample]:
    p, c = core.params, core.counters
    hit_rate = c.prefix_hits / c.prefix_queries if c.prefix_queries else 0.0
    return [
        ("sglang:num_running_reqs", "gauge", "The number of running requests.", len(core.running)),
        ("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", len(core.waiting)),
        ("sglang:token_usage", "gauge", "The token usage.", core.kv_usage),
        ("sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.", hit_rate),
        ("sglang:kv_used_tokens", "gauge", "KV cache tokens in use.", core.kv_used_tokens),
        ("sglang:kv_available_tokens", "gauge", "KV cache tokens available.",
         p.kv_budget_tokens - core.kv_used_tokens),
        ("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.", c.prompt_tokens),
        ("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.",
         c.generation_tokens),
        ("sglang:cached_tokens_total", "counter", "Number of cached prompt tokens.", c.prefix_hits),
    ]  # fmt: skip


def _llamacpp(core: BatchCore) -> list[_Sample]:
    # Names, order and help texts follow a real llama-server (tests/fixtures/engines/llamacpp_*.metrics.txt);
    # there, prompt_tokens_total excludes cached tokens. Speculative decoding is never simulated.
    c = core.counters
    busy = c.busy_slot_steps / c.steps if c.steps else 0.0
    prompt_rate = c.prefill_tokens / c.prefill_seconds if c.prefill_seconds else 0.0
    predicted_rate = c.generation_tokens / c.decode_seconds if c.decode_seconds else 0.0
    spec = "Speculative: Total"
    return [
        ("llamacpp:prompt_tokens_total", "counter",
         "Number of prompt tokens processed, excluding cached tokens", c.prefill_tokens),
        ("llamacpp:prompt_tokens_cached_total", "counter", "Number of prompt tokens reused from the cache",
         c.prefix_hits),
        ("llamacpp:prompt_seconds_total", "counter", "Total time spent processing prompts",
         c.prefill_seconds),
        ("llamacpp:tokens_predicted_total", "counter", "Number of generation tokens processed",
         c.generation_tokens),
        ("llamacpp:tokens_predicted_seconds_total", "counter", "Total time spent generating tokens",
         c.decode_seconds),
        ("llamacpp:n_decode_total", "counter", "Total number of llama_decode() calls, excluding speculative "
         "decoding and multimodal decoding", c.steps),
        ("llamacpp:n_tokens_max", "counter", "Largest observed sequence length (prompt + generation)",
         c.max_seq_tokens),
        ("llamacpp:spec_decode_num_draft_tokens_total", "counter", f"{spec} draft tokens generated", 0),
        ("llamacpp:spec_decode_num_accepted_tokens_total", "counter",
         f"{spec} draft tokens accepted by the target model", 0),
        ("llamacpp:spec_decode_num_drafts_total", "counter",
         f"{spec} speculative decoding verification steps", 0),
        ("llamacpp:prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s", prompt_rate),
        ("llamacpp:predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s",
         predicted_rate),
        ("llamacpp:requests_processing", "gauge", "Number of requests processing", len(core.running)),
        ("llamacpp:requests_deferred", "gauge", "Number of requests deferred", len(core.waiting)),
        ("llamacpp:n_busy_slots_per_decode", "gauge", "Average number of busy slots per llama_decode() call",
         busy),
    ]  # fmt: skip


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _series(name: str, labels: Labels, value: float) -> str:
    # Label names sorted, as vLLM writes them.
    text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{text}}} {_number(value)}" if text else f"{name} {_number(value)}"


def _render(samples: list[_Sample], common: Labels) -> str:
    lines: list[str] = []
    for name, kind, help_text, value in samples:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        if isinstance(value, Histogram):
            lines += [_series(f"{name}_bucket", common | {"le": le}, n) for le, n in value.cumulative()]
            lines.append(_series(f"{name}_count", common, value.count))
            lines.append(_series(f"{name}_sum", common, value.sum))
            continue
        series = value if isinstance(value, list) else [({}, value)]
        # An info metric carries only its own labels (vLLM's cache_config_info has no model_name).
        own = name.endswith("_info")
        lines += [_series(name, extra if own else common | extra, v) for extra, v in series]
    return "\n".join(lines) + "\n"
