"""NVIDIA NIM for LLMs: its table."""

from __future__ import annotations

from engines import vllm
from engines.base import LaunchSpec
from engines.promtext import LoadTable
from engines.table import MessagesTokenizer, TableAdapter


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
ADAPTER = TableAdapter(
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
