"""LMDeploy (`lmdeploy serve api_server`): its table."""

from __future__ import annotations

from engines.base import LaunchSpec
from engines.promtext import LoadTable
from engines.table import PromptTokenizer, TableAdapter, cap_flag, name_flag


def _lmdeploy_launch(spec: LaunchSpec) -> list[str]:
    return [
        "lmdeploy", "serve", "api_server", spec.model, *name_flag("--model-name", spec.served_name),
        "--server-name", spec.host, "--server-port", str(spec.port),
        *cap_flag("--session-len", spec.max_context_tokens),
        "--max-batch-size", str(spec.parallel),
    ]  # fmt: skip


ADAPTER = TableAdapter(
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
