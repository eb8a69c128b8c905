"""Prometheus text exposition of the simulator, under each flavour's own metric names.

Written by hand (no prometheus_client): a scrape is a few string joins over the batching core's counters.
"""

from __future__ import annotations

from engines.sim_model import BatchCore

# (name, type, help, value or {labels: value})
_Sample = tuple[str, str, str, float | dict[str, float]]


def exposition(core: BatchCore) -> str:
    params = core.params
    c = core.counters
    if params.flavour == "vllm":
        labels = f'model_name="{params.model}",engine="0"'
        samples: list[_Sample] = [
            (
                "vllm:num_requests_running",
                "gauge",
                "Number of requests in model execution batches.",
                len(core.running),
            ),
            (
                "vllm:num_requests_waiting",
                "gauge",
                "Number of requests waiting to be processed.",
                len(core.waiting),
            ),
            (
                "vllm:kv_cache_usage_perc",
                "gauge",
                "KV-cache usage. 1 means 100 percent usage.",
                core.kv_usage,
            ),
            (
                "vllm:prefix_cache_queries_total",
                "counter",
                "Prefix cache queries, in terms of tokens.",
                c.prefix_queries,
            ),
            (
                "vllm:prefix_cache_hits_total",
                "counter",
                "Prefix cache hits, in terms of tokens.",
                c.prefix_hits,
            ),
            ("vllm:prompt_tokens_cached_total", "counter", "Number of cached prompt tokens.", c.prefix_hits),
            ("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.", 0),
            ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", c.prompt_tokens),
            (
                "vllm:generation_tokens_total",
                "counter",
                "Number of generation tokens processed.",
                c.generation_tokens,
            ),
            (
                "vllm:request_success_total",
                "counter",
                "Count of successfully processed requests.",
                {f'finished_reason="{k}"': float(v) for k, v in c.finished.items()},
            ),
            (
                "vllm:cache_config_info",
                "gauge",
                "Information of the LLMEngine CacheConfig",
                {
                    f'block_size="{params.block_size}",enable_prefix_caching="True",'
                    f'num_gpu_blocks="{params.kv_budget_tokens // params.block_size}"': 1.0
                },
            ),
        ]
    elif params.flavour == "sglang":
        labels = f'model_name="{params.model}"'
        hit_rate = c.prefix_hits / c.prefix_queries if c.prefix_queries else 0.0
        samples = [
            ("sglang:num_running_reqs", "gauge", "The number of running requests.", len(core.running)),
            (
                "sglang:num_queue_reqs",
                "gauge",
                "The number of requests in the waiting queue.",
                len(core.waiting),
            ),
            ("sglang:token_usage", "gauge", "The token usage.", core.kv_usage),
            ("sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.", hit_rate),
            ("sglang:kv_used_tokens", "gauge", "KV cache tokens in use.", core.kv_used_tokens),
            (
                "sglang:kv_available_tokens",
                "gauge",
                "KV cache tokens available.",
                params.kv_budget_tokens - core.kv_used_tokens,
            ),
            ("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.", c.prompt_tokens),
            (
                "sglang:generation_tokens_total",
                "counter",
                "Number of generation tokens processed.",
                c.generation_tokens,
            ),
            ("sglang:cached_tokens_total", "counter", "Number of cached prompt tokens.", c.prefix_hits),
        ]
    else:
        labels = ""
        busy = c.busy_slot_steps / c.steps if c.steps else 0.0
        samples = [
            (
                "llamacpp:prompt_tokens_total",
                "counter",
                "Number of prompt tokens processed.",
                c.prompt_tokens,
            ),
            (
                "llamacpp:tokens_predicted_total",
                "counter",
                "Number of generation tokens processed.",
                c.generation_tokens,
            ),
            (
                "llamacpp:prompt_tokens_cached_total",
                "counter",
                "Number of prompt tokens served from cache.",
                c.prefix_hits,
            ),
            ("llamacpp:n_decode_total", "counter", "Total number of llama_decode() calls", c.steps),
            (
                "llamacpp:n_busy_slots_per_decode",
                "gauge",
                "Average number of busy slots per llama_decode() call",
                busy,
            ),
            ("llamacpp:requests_processing", "gauge", "Number of requests processing.", len(core.running)),
            ("llamacpp:requests_deferred", "gauge", "Number of requests deferred.", len(core.waiting)),
        ]
    return _render(samples, labels)


def _render(samples: list[_Sample], common: str) -> str:
    lines: list[str] = []
    for name, kind, help_text, value in samples:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        series = value if isinstance(value, dict) else {"": float(value)}
        for extra, v in series.items():
            label_text = ",".join(part for part in (common, extra) if part)
            lines.append(f"{name}{{{label_text}}} {float(v)}" if label_text else f"{name} {float(v)}")
    return "\n".join(lines) + "\n"
