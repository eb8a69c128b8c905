"""`adapter_for(kind)`: the adapter of each engine kind, one module per engine."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from engines import llamacpp, lmdeploy, nim, ollama, openai, sglang, simulated, trtllm, vllm
from engines.base import EngineAdapter
from engines.table import TableAdapter

_ALL: tuple[TableAdapter, ...] = (
    vllm.ADAPTER, sglang.ADAPTER, llamacpp.ADAPTER, trtllm.ADAPTER, lmdeploy.ADAPTER, nim.ADAPTER, ollama.ADAPTER,
    openai.ADAPTER, simulated.ADAPTER,
)  # fmt: skip
ADAPTERS: Mapping[str, EngineAdapter] = MappingProxyType({a.kind: a for a in _ALL})
KINDS = tuple(ADAPTERS)


def adapter_for(kind: str) -> EngineAdapter:
    """The adapter for an engine kind; ValueError names the known kinds for an unknown one."""
    try:
        return ADAPTERS[kind]
    except KeyError:
        raise ValueError(f"unknown engine kind {kind!r}; known kinds: {', '.join(KINDS)}") from None
