"""llama.cpp (`llama-server`): health, metric names, the two-step chat token count, launch argv."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engines.base import LaunchSpec, TokenizeCall
from engines.promtext import LoadTable, Ratio
from engines.table import Messages, ModelsTable, TableAdapter, name_flag

LOAD = LoadTable(
    running=("llamacpp:requests_processing",),
    waiting=("llamacpp:requests_deferred",),
    # No KV-usage gauge at all. prompt_tokens_total counts only the tokens it evaluated ("excluding
    # cached tokens", says its HELP), so the hit rate is cached / (cached + evaluated).
    hit_ratios=(Ratio("llamacpp:prompt_tokens_cached_total", "llamacpp:prompt_tokens_total", False),),
)


def _tokenize(content: str) -> TokenizeCall:
    # add_special as the server itself does for a completion, so the count matches usage.prompt_tokens.
    return TokenizeCall("/tokenize", {"content": content, "add_special": True})


@dataclass(frozen=True, slots=True)
class LlamaCppTokenizer:
    """/tokenize takes text only: chat messages are first rendered by /apply-template, then tokenized."""

    def calls(self, model: str, messages: Messages, prompt: str | None) -> Sequence[TokenizeCall]:
        if messages is not None:
            return (TokenizeCall("/apply-template", {"messages": list(messages)}),)
        if prompt is not None:
            return (_tokenize(prompt),)
        return ()

    def follow_up(self, responses: Sequence[Any]) -> TokenizeCall | None:
        last = responses[-1] if len(responses) == 1 else None
        if isinstance(last, Mapping) and isinstance(last.get("prompt"), str) and "tokens" not in last:
            return _tokenize(last["prompt"])
        return None

    def count(self, responses: Sequence[Any]) -> int | None:
        tokens = responses[-1].get("tokens") if responses and isinstance(responses[-1], Mapping) else None
        return len(tokens) if isinstance(tokens, list) else None


# /v1/models lists the alias (`-a`), else the model file's path; /props has the window a request gets:
# default_generation_settings.n_ctx is per slot (-c / --parallel: 512 for -c 2048 --parallel 4, checked on
# the real server), as is each entry's meta.n_ctx; meta.n_ctx_train is the model's training length, not
# what the server allows. It answers to any model name.
MODELS = ModelsTable(
    window_keys=(("meta", "n_ctx"),),
    info_path="/props",
    info_window=(("default_generation_settings", "n_ctx"),),
    any_model=True,
)


def launch(spec: LaunchSpec) -> list[str]:
    parallel = max(1, spec.parallel)
    argv = ["llama-server", "-m", spec.model, *name_flag("--alias", spec.served_name)]
    argv += ["--host", spec.host, "--port", str(spec.port)]
    if spec.max_context_tokens is not None:
        # -c is the whole KV cache, split evenly across the --parallel slots: each slot gets c/parallel.
        argv += ["-c", str(spec.max_context_tokens * parallel)]
    return [*argv, "--parallel", str(parallel), "--metrics"]


ADAPTER = TableAdapter(
    kind="llamacpp",
    health_path="/health",  # 503 while the model loads
    metrics_path="/metrics",  # only with --metrics; 501 otherwise
    load=LOAD,
    tokenizer=LlamaCppTokenizer(),
    launch=launch,
    # llama-server answers many client mistakes with a 500 (docs/reliability.md defect 2): malformed
    # JSON or a number out of range ("seed": 1e400), a tool without its function, an image or audio
    # part to a model without a projector, an unknown content part. Read here, they become a 400.
    client_faults=(
        "json.exception.",
        "failed to parse",
        "missing tool function",
        "input is not supported",
        "unsupported content",
        "is not supported",
    ),
    # Measured on llama.cpp b1-7e4c0a9 (PR #17570): /v1/messages and count_tokens.
    native_apis=frozenset({"messages", "count_tokens"}),
    # Its Messages endpoint hands a `system` message inside `messages` to the chat template, and
    # common templates (Qwen's) refuse one anywhere but first; it reads only thinking.type "enabled".
    native_fixes=frozenset({"fold_system", "thinking_enabled"}),
    models=MODELS,
)
