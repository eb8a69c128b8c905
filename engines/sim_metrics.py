"""Prometheus text exposition of the simulator, under each flavour's own metric names.

Written by hand (no prometheus_client): a scrape is a few string joins over the batching core's counters.
"""

from __future__ import annotations

from engines.sim_model import BatchCore

# (name, type, help, value or {extra labels: value})
_Sample = tuple[str, str, str, float | dict[str, float]]


def exposition(core: BatchCore) -> str:
    flavour = core.params.flavour
    if flavour == "vllm":
        return _render(_vllm(core), f'model_name="{core.params.model}",engine="0"')
    if flavour == "sglang":
        return _render(_sglang(core), f'model_name="{core.params.model}"')
    return _render(_llamacpp(core), "")


def _vllm(core: BatchCore) -> list[_Sample]:
    p, c = core.params, core.counters
    config = (
        f'block_size="{p.block_size}",enable_prefix_caching="True",'
        f'num_gpu_blocks="{p.kv_budget_tokens // p.block_size}"'
    )
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
        ("vllm:prompt_tokens_cached_total", "counter", "Number of cached prompt tokens.", c.prefix_hits),
        ("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.", 0),
        ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", c.prompt_tokens),
        ("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
         c.generation_tokens),
        ("vllm:request_success_total", "counter", "Count of successfully processed requests.",
         {f'finished_reason="{k}"': v for k, v in c.finished.items()}),
        ("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig", {config: 1}),
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


def _render(samples: list[_Sample], common: str) -> str:
    lines: list[str] = []
    for name, kind, help_text, value in samples:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        series = value if isinstance(value, dict) else {"": value}
        for extra, v in series.items():
            label_text = ",".join(part for part in (common, extra) if part)
            lines.append(f"{name}{{{label_text}}} {_number(v)}" if label_text else f"{name} {_number(v)}")
    return "\n".join(lines) + "\n"
