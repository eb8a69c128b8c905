"""Ollama: its table."""

from __future__ import annotations

from engines.base import LaunchSpec
from engines.table import TableAdapter


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
ADAPTER = TableAdapter(kind="ollama", health_path="/api/version", metrics_path="", launch=_ollama_launch)
