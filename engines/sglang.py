"""SGLang (`python -m sglang.launch_server`): health, metric names under both prefixes, launch argv."""

from __future__ import annotations

from engines.base import LaunchSpec
from engines.promtext import LoadTable, Ratio
from engines.table import MessagesTokenizer, ModelsTable, TableAdapter, cap_flag, name_flag, tool_parser

# Releases differ: "sglang:" like vLLM, or "sglang_" (the plain Prometheus style).
_PREFIXES = ("sglang:", "sglang_")


def _both(name: str) -> tuple[str, ...]:
    return tuple(prefix + name for prefix in _PREFIXES)


LOAD = LoadTable(
    running=_both("num_running_reqs"),
    waiting=_both("num_queue_reqs"),
    kv_usage=_both("token_usage"),
    # Cumulative counters first (cached_tokens_total is labelled by cache_source in newer releases,
    # and the reader sums label sets); the cache_hit_rate gauge where they are missing.
    hit_ratios=tuple(Ratio(f"{p}cached_tokens_total", f"{p}prompt_tokens_total") for p in _PREFIXES),
    hit_rate=_both("cache_hit_rate"),
)

# /tokenize (PR #9545) takes {"model", "messages", "add_generation_prompt"} or {"model", "prompt"} and
# answers {"tokens", "count", "max_model_len"}, like vLLM's: checked on a real SGLang 0.5.23, whose
# count for a chat equals the usage.prompt_tokens of the same request (tests/fixtures/sglang/).
TOKENIZER = MessagesTokenizer()


def launch(spec: LaunchSpec) -> list[str]:
    return [
        "python", "-m", "sglang.launch_server", "--model-path", spec.model,
        *name_flag("--served-model-name", spec.served_name),
        "--host", spec.host, "--port", str(spec.port),
        *cap_flag("--context-length", spec.max_context_tokens),
        "--enable-metrics",  # without it there is no /metrics, so no load signals
        "--tool-call-parser", tool_parser(spec.model, "sglang"),  # agents' tool calls as tool calls
    ]  # fmt: skip


ADAPTER = TableAdapter(
    kind="sglang",
    # In 0.5 /health runs a one-token generation (~1 s on a CPU); /ready is cheap but newer, and an
    # engine that lacks it would look down forever. The health check's timeout allows for the former.
    health_path="/health",
    metrics_path="/metrics",
    load=LOAD,
    tokenizer=TOKENIZER,
    launch=launch,
    # Measured on SGLang 0.5.23 (tests/fixtures/sglang/proto_*): /v1/messages and count_tokens;
    # /v1/responses (stream too; GET by id and previous_response_id need --enable-response-store),
    # /tokenize and /detokenize.
    native_apis=frozenset({"messages", "count_tokens", "responses", "tokenize"}),
    # /v1/models: {"id": <--served-model-name>, "owned_by": "sglang", "max_model_len": <the served window>};
    # /v1/tokenize's max_model_len is the model config's, not --context-length (tests/fixtures/sglang/).
    models=ModelsTable(window_keys=(("max_model_len",),)),
)
