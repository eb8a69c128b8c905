"""Request bodies for a run, seeded: `chat` (one-off prompts of varied length), `agent` (a fixed system
prompt and tools, multi-turn conversations that resend their history), `long-context` (prompts near
a length), or the user's own JSONL file of request bodies."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BUILTIN = ("chat", "agent", "long-context")
DEFAULT_PROMPT_TOKENS = {"chat": 256, "agent": 64, "long-context": 3000}
CHARS_PER_TOKEN = 4  # text is sized at about 4 characters a token (the simulator's rule; close for BPEs)
_WORDS = [
    "model",
    "engine",
    "batch",
    "token",
    "cache",
    "prefix",
    "answer",
    "request",
    "stream",
    "route",
    "pool",
    "latency",
    "queue",
    "memory",
    "kernel",
    "tensor",
    "layer",
    "sample",
    "decode",
    "prefill",
    "context",
    "window",
    "budget",
    "signal",
    "metric",
    "gateway",
]
AGENT_SYSTEM = (
    "You are a careful coding agent. You plan before you act, call one tool at a time, read every "
    "tool result, and stop when the task is done. "
)
AGENT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name.replace('_', ' ')} in the workspace",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    }
    for name in ("read_file", "write_file", "run_tests", "search_code")
]


class WorkloadError(ValueError):
    """A workload that cannot be built (an unreadable or malformed JSONL file)."""


@dataclass(frozen=True)
class WorkloadSpec:
    kind: str  # one of BUILTIN, or a path to a JSONL file
    prompt_tokens: int | None = None
    output_tokens: int = 64
    seed: int = 0
    ignore_eos: bool = True  # ask the engine to generate exactly output_tokens


def text(rng: random.Random, tokens: int) -> str:
    """Filler words totalling about ``tokens`` tokens."""
    out: list[str] = []
    size = 0
    while size < tokens * CHARS_PER_TOKEN:
        word = rng.choice(_WORDS)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)


def _finish(body: dict[str, Any], spec: WorkloadSpec, model: str | None) -> dict[str, Any]:
    """Stream with usage, fixed output length where the engine allows (vLLM, SGLang, llama.cpp)."""
    body = dict(body)
    if model:
        body["model"] = model
    body["stream"] = True
    body["stream_options"] = {**body.get("stream_options", {}), "include_usage": True}
    if spec.kind in BUILTIN or "max_tokens" not in body:
        body["max_tokens"] = spec.output_tokens
    if spec.ignore_eos:
        body.setdefault("ignore_eos", True)
        body.setdefault("min_tokens", body["max_tokens"])
    return body


def _chat(rng: random.Random, mean_tokens: int) -> dict[str, Any]:
    n = max(1, round(mean_tokens * rng.uniform(0.5, 1.5)))
    return {"messages": [{"role": "user", "content": f"{rng.randrange(10**9)} {text(rng, n)}"}]}


def _long(rng: random.Random, tokens: int) -> dict[str, Any]:
    n = max(1, round(tokens * rng.uniform(0.9, 1.0)))
    return {"messages": [{"role": "user", "content": f"{rng.randrange(10**9)} {text(rng, n)}"}]}


def _agent(rng: random.Random, turn_tokens: int, output_tokens: int) -> Iterator[dict[str, Any]]:
    """Conversations of 2-6 turns, interleaved 8 at a time, each turn resending the whole history."""
    system = AGENT_SYSTEM * 8
    live: list[tuple[list[dict[str, Any]], int]] = []
    while True:
        while len(live) < 8:
            live.append(([{"role": "system", "content": system}], rng.randint(2, 6)))
        i = rng.randrange(len(live))
        history, left = live[i]
        history.append({"role": "user", "content": f"step {rng.randrange(10**6)}: {text(rng, turn_tokens)}"})
        yield {"messages": list(history), "tools": AGENT_TOOLS}
        # The next turn resends a stand-in for this turn's answer, the same length the engine is asked for.
        history.append({"role": "assistant", "content": text(rng, output_tokens)})
        if left <= 1:
            live.pop(i)
        else:
            live[i] = (history, left - 1)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise WorkloadError(f"{path}: {exc.strerror}") from exc
    bodies = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            body = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{path}:{n}: not JSON ({exc.msg})") from exc
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            raise WorkloadError(f"{path}:{n}: not a chat completions body (an object with 'messages')")
        bodies.append(body)
    if not bodies:
        raise WorkloadError(f"{path}: no request bodies")
    return bodies


def bodies(spec: WorkloadSpec, model: str | None) -> Iterator[dict[str, Any]]:
    """An endless, seeded stream of chat completions bodies; a JSONL file is cycled through."""
    rng = random.Random(spec.seed)
    if spec.kind not in BUILTIN:
        items = _jsonl(Path(spec.kind))
        while True:
            for item in items:
                yield _finish(item, spec, model)
    tokens = spec.prompt_tokens or DEFAULT_PROMPT_TOKENS[spec.kind]
    if spec.kind == "agent":
        for body in _agent(rng, tokens, spec.output_tokens):
            yield _finish(body, spec, model)
    while True:
        body = _chat(rng, tokens) if spec.kind == "chat" else _long(rng, tokens)
        yield _finish(body, spec, model)
