"""The generic `openai` engine: any other OpenAI-compatible server."""

from __future__ import annotations

from engines.table import TableAdapter

# /v1/models is the one path the API guarantees, and there are no metrics, tokenizer or launch
# command we could know of.
ADAPTER = TableAdapter(kind="openai", health_path="/v1/models", metrics_path="")
