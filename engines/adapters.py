"""`adapter_for(kind)`: the adapter of each engine kind, with the tables of the OpenAI-compatible engines
that need no code of their own (TensorRT-LLM, LMDeploy, NIM, Ollama) and of the simulator."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from engines import llamacpp, openai, sglang, vllm
from engines.base import EngineAdapter, LaunchSpec
from engines.openai import MessagesTokenizer, PromptTokenizer, TableAdapter, cap_flag, name_flag
from engines.promtext import LoadTable, Ratio


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


TRTLLM = TableAdapter(
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


def _lmdeploy_launch(spec: LaunchSpec) -> list[str]:
    return [
        "lmdeploy", "serve", "api_server", spec.model, *name_flag("--model-name", spec.served_name),
        "--server-name", spec.host, "--server-port", str(spec.port),
        *cap_flag("--session-len", spec.max_context_tokens),
        "--max-batch-size", str(spec.parallel),
    ]  # fmt: skip


LMDEPLOY = TableAdapter(
    kind="lmdeploy",
    health_path="/health",
    metrics_path="/metrics",
    load=LoadTable(
        running=("lmdeploy:num_requests_running",),
        waiting=("lmdeploy:num_requests_waiting",),
        kv_usage=("lmdeploy:gpu_cache_usage_perc",),
        hit_rate=("lmdeploy:prefix_cache_hit_rate",),
    ),
    # /v1/encode tokenizes a raw prompt; it can't take a chat message list.
    tokenizer=PromptTokenizer(
        path="/v1/encode",
        prompt_key="input",
        count_key="length",
        extra=(("do_preprocess", False), ("add_bos", True)),
        send_model=False,
    ),
    launch=_lmdeploy_launch,
)


def _nim_launch(spec: LaunchSpec) -> list[str]:
    # A NIM is a container: the image is the model. NGC_API_KEY passes through from the environment.
    image = spec.extra.get("image")
    cap = spec.max_context_tokens
    return [
        "docker", "run", "--rm", "--gpus", "all", "-e", "NGC_API_KEY",
        *(["-e", f"NIM_MAX_MODEL_LEN={cap}"] if cap is not None else []),
        "-p", f"{spec.host}:{spec.port}:8000",
        image if isinstance(image, str) else spec.model,
    ]  # fmt: skip


# NIM for LLMs wraps vLLM (2.x), or TensorRT-LLM / vLLM / SGLang (1.x): its /v1/metrics carries the
# backend's names, and the 1.x docs list them unprefixed.
NIM = TableAdapter(
    kind="nim",
    health_path="/v1/health/ready",
    metrics_path="/v1/metrics",
    load=vllm.LOAD.merge(
        LoadTable(
            running=("num_requests_running", "trtllm_num_requests_running"),
            waiting=("num_requests_waiting", "trtllm_num_requests_waiting"),
            kv_usage=("gpu_cache_usage_perc", "trtllm_kv_cache_utilization"),
        )
    ),
    tokenizer=MessagesTokenizer(),  # NIM 2.x serves vLLM's /tokenize; elsewhere a 404 means "estimate"
    launch=_nim_launch,
)


def _ollama_launch(spec: LaunchSpec) -> list[str]:
    # The model is pulled and loaded on first use, not named at launch. Each request gets the whole
    # context length (parallel requests multiply memory, they don't split the context).
    cap = spec.max_context_tokens
    return [
        "env", f"OLLAMA_HOST={spec.host}:{spec.port}",
        *([f"OLLAMA_CONTEXT_LENGTH={cap}"] if cap is not None else []),
        f"OLLAMA_NUM_PARALLEL={spec.parallel}", "ollama", "serve",
    ]  # fmt: skip


# Ollama has no Prometheus metrics and no tokenizer endpoint. It silently truncates an over-long
# prompt instead of refusing it, so the gateway's own cap check is the only one.
OLLAMA = TableAdapter(kind="ollama", health_path="/api/version", metrics_path="", launch=_ollama_launch)

# The simulator imitates a vLLM, SGLang or llama.cpp flavour, so it accepts all their names. It is
# started in-process (tests, `gateway demo`), so there is nothing to launch.
SIM = TableAdapter(
    kind="sim",
    health_path="/health",
    metrics_path="/metrics",
    load=vllm.LOAD.merge(sglang.LOAD).merge(llamacpp.LOAD),
)

_ALL: tuple[TableAdapter, ...] = (
    vllm.ADAPTER, sglang.ADAPTER, llamacpp.ADAPTER, TRTLLM, LMDEPLOY, NIM, OLLAMA, openai.ADAPTER, SIM,
)  # fmt: skip
ADAPTERS: Mapping[str, EngineAdapter] = MappingProxyType({a.kind: a for a in _ALL})
KINDS = tuple(ADAPTERS)


def adapter_for(kind: str) -> EngineAdapter:
    """The adapter for an engine kind; ValueError names the known kinds for an unknown one."""
    try:
        return ADAPTERS[kind]
    except KeyError:
        raise ValueError(f"unknown engine kind {kind!r}; known kinds: {', '.join(KINDS)}") from None
