"""The table-driven adapter that every engine module fills in.

Every engine here speaks the OpenAI API; what differs is a table: health path, metric names (with
renamed fallbacks), tokenizer calls, launch command. Every error body becomes the one OpenAI shape.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from engines.base import EngineLoad, LaunchSpec, ModelsCall, NormalisedError, ServedModel, TokenizeCall
from engines.context_error import in_openai_words
from engines.promtext import LoadTable

Messages = Sequence[Mapping[str, Any]] | None


# Phrases (lower case) by which each engine says "too long for the context window"; see docs/engines.md.
CONTEXT_PHRASES = (
    "maximum context length",  # vLLM (old and new), SGLang prompt + max_tokens, OpenAI itself
    "longer than the model's context length",  # SGLang prompt
    "longer than the maximum model length",  # newer vLLM
    "exceeds the maximum allowed length",  # SGLang scheduler
    "exceeds the available context size",  # llama.cpp
    "max_seq_len",  # TensorRT-LLM: "... is greater than max_seq_len (N)"
    "exceeds the context length",  # Ollama
    "exceed session",  # LMDeploy: "exceed session max length"
    "context_length_exceeded",
)
_MESSAGE_LIMIT = 1000
_SNIPPET_LIMIT = 160
_MAX_JSON = 1 << 20  # error bodies are small; a bigger one is a page, not an error object
_SNIPPET_SCAN = 16 << 10  # how much of a non-JSON body to look at for the snippet
_WORD = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_URL = re.compile(r"\b[a-z][a-z0-9+.\-]*://[^\s\"'<>]+", re.IGNORECASE)
# File paths (an engine's traceback line names its install directory): /a/b and deeper.
_PATH = re.compile(r"(?<![\w<])(?:/[\w.\-]+){2,}/?")
_HOST = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b|\blocalhost:\d+\b", re.IGNORECASE)
_BLOCK = re.compile(r"<(script|style)\b.*?</\1\s*>", re.IGNORECASE | re.DOTALL)
_TAG = re.compile(r"<[^>]*>")
_SPACE = re.compile(r"\s+")


def _clean(text: str, limit: int) -> str:
    """One line, no URLs, internal addresses or file paths (they'd leak topology and installs to clients),
    at most `limit` chars."""
    text = _PATH.sub("<path>", _HOST.sub("<host>", _URL.sub("<url>", text[: limit * 4])))
    text = _SPACE.sub(" ", "".join(ch if ch.isprintable() else " " for ch in text)).strip()
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _word(value: Any) -> str | None:
    """A short identifier (an error code, type or param), or None: engines send ints for `code`."""
    return value if isinstance(value, str) and _WORD.fullmatch(value) else None


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):  # FastAPI's validation "detail": [{"msg": ...}, ...]
        return "; ".join(str(v.get("msg", v)) if isinstance(v, Mapping) else str(v) for v in value)
    return str(value)


def _read(body: bytes) -> tuple[str | None, str | None, str | None, str | None]:
    """(message, type, code, param) from any engine's JSON error shape; all None for a non-JSON body."""
    if len(body) > _MAX_JSON:
        return None, None, None, None
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):  # HTML, truncated JSON, bad UTF-8, absurd nesting
        return None, None, None, None
    if not isinstance(doc, Mapping):
        return None, None, None, None
    inner = doc.get("error")
    if isinstance(inner, str):  # Ollama's native API: {"error": "..."}
        return inner, None, None, None
    # vLLM and llama.cpp nest under "error"; SGLang, LMDeploy and old vLLM put it at the top level.
    src = inner if isinstance(inner, Mapping) else doc
    message = _text(src.get("message", src.get("detail")))
    return message, _word(src.get("type")), _word(src.get("code")), _word(src.get("param"))


def _snippet(body: bytes) -> str:
    text = body[:_SNIPPET_SCAN].decode("utf-8", "replace")
    text = _clean(_TAG.sub(" ", _BLOCK.sub(" ", text)), _SNIPPET_LIMIT)
    return text or "empty body"


def normalise_error(status: int, body: bytes, client_faults: tuple[str, ...] = ()) -> NormalisedError:
    """Any engine's error response as one OpenAI-shaped error. Never raises."""
    raw, etype, code, param = _read(body)
    message = _clean(raw, _MESSAGE_LIMIT) if raw else ""
    lower = message.lower()
    if status >= 400 and (
        etype == "exceed_context_size_error"
        or code == "context_length_exceeded"
        or any(phrase in lower for phrase in CONTEXT_PHRASES)
    ):
        # Whatever status the engine used (llama.cpp builds differ: 400 or 500), it's the client's.
        message = in_openai_words(message) if message else "the prompt is longer than the model's context window"
        return NormalisedError(400, message, "invalid_request_error", "context_length_exceeded", param)
    if 400 <= status < 500:
        if status in (401, 403):
            # The gateway sends the backend's key, never the client's: this is our misconfiguration.
            return NormalisedError(
                502, f"the backend refused the gateway's credentials (HTTP {status})", "upstream_error", None
            )
        message = message or f"the backend rejected the request (HTTP {status}): {_snippet(body)}"
        if status == 404:
            if "model" in lower:
                return NormalisedError(404, message, "invalid_request_error", "model_not_found", param)
            # A bare "Not Found" is a path the engine does not serve (vLLM's /v1/embeddings for a
            # generative model), not an unknown model: saying model_not_found would mislead.
            message = f"the backend does not serve this endpoint (HTTP 404): {message}"
            return NormalisedError(404, message, "invalid_request_error", "not_found", param)
        if status == 429:
            return NormalisedError(429, message, "rate_limit_error", code, param)
        return NormalisedError(status, message, "invalid_request_error", code, param)
    if status == 501:
        # The engine does not serve this endpoint (llama-server's /v1/embeddings without --embeddings):
        # a deployment's gap, not a failing backend. The engine's own words say which flag is missing.
        message = message or f"the backend does not support this request (HTTP 501): {_snippet(body)}"
        return NormalisedError(501, message, "invalid_request_error", "not_supported", param)
    if message and any(fault in lower for fault in client_faults):
        return NormalisedError(400, message, "invalid_request_error", None, param)
    return NormalisedError(502, f"upstream error (HTTP {status}): {message or _snippet(body)}", "upstream_error", None)


class Tokenizer(Protocol):
    """How one engine counts a prompt's tokens (see EngineAdapter for the caller's loop)."""

    def calls(self, model: str, messages: Messages, prompt: str | None) -> Sequence[TokenizeCall]: ...

    def follow_up(self, responses: Sequence[Any]) -> TokenizeCall | None: ...

    def count(self, responses: Sequence[Any]) -> int | None: ...


def count_field(response: Any, key: str) -> int | None:
    """A non-negative int under `key`, else the length of a "tokens" list, else None."""
    if not isinstance(response, Mapping):
        return None
    value = response.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    tokens = response.get("tokens")
    return len(tokens) if isinstance(tokens, list) else None


@dataclass(frozen=True, slots=True)
class NoTokenizer:
    """The engine has no tokenizer endpoint: the gateway estimates instead."""

    def calls(self, model: str, messages: Messages, prompt: str | None) -> Sequence[TokenizeCall]:
        return ()

    def follow_up(self, responses: Sequence[Any]) -> TokenizeCall | None:
        return None

    def count(self, responses: Sequence[Any]) -> int | None:
        return None


@dataclass(frozen=True, slots=True)
class PromptTokenizer:
    """An endpoint that tokenizes a raw prompt only. Chat messages need the chat template, which such an
    endpoint can't apply, and a count without it is no better than the estimate: no call for them."""

    path: str
    prompt_key: str
    count_key: str
    extra: tuple[tuple[str, Any], ...] = ()
    send_model: bool = True

    def calls(self, model: str, messages: Messages, prompt: str | None) -> Sequence[TokenizeCall]:
        if messages is not None or prompt is None:
            return ()
        body: dict[str, Any] = {"model": model} if self.send_model else {}
        body[self.prompt_key] = prompt
        body.update(self.extra)
        return (TokenizeCall(self.path, body),)

    def follow_up(self, responses: Sequence[Any]) -> TokenizeCall | None:
        return None

    def count(self, responses: Sequence[Any]) -> int | None:
        return count_field(responses[-1], self.count_key) if responses else None


NO_TOKENIZER = NoTokenizer()
NO_LOAD = LoadTable()


def no_launch(spec: LaunchSpec) -> list[str]:
    """Nothing to launch (an external service, or the built-in simulator): `gateway plan` says so."""
    return []


def name_flag(flag: str, name: str | None) -> list[str]:
    """The engine's served-name flag and the name, or nothing when the model path is the name."""
    return [] if name is None else [flag, name]


# A model family's tool-call parser, by a word in the model's name: vLLM's names, then SGLang's. An
# agent offers tools on every request, and without a parser both engines refuse (vLLM) or return
# the calls as text; the first match wins, so the more specific names come first.
_TOOL_PARSERS: tuple[tuple[str, str, str], ...] = (
    ("qwen3-coder", "qwen3_coder", "qwen3_coder"),
    ("qwen", "hermes", "qwen25"),
    ("gpt-oss", "openai", "gpt-oss"),
    ("deepseek-v3", "deepseek_v3", "deepseekv3"),
    ("deepseek", "deepseek_v3", "deepseekv3"),
    ("llama-4", "llama4_pythonic", "pythonic"),
    ("llama", "llama3_json", "llama3"),
    ("mistral", "mistral", "mistral"),
    ("glm", "glm45", "glm45"),
    ("kimi", "kimi_k2", "kimi_k2"),
)


def tool_parser(model: str, engine: str) -> str:
    """The tool-call parser for `model` on `engine` ("vllm" or "sglang"); hermes's format otherwise."""
    name = model.lower()
    for word, vllm, sglang in _TOOL_PARSERS:
        if word in name:
            return vllm if engine == "vllm" else sglang
    return "hermes" if engine == "vllm" else "qwen25"


def cap_flag(flag: str, value: int | None) -> list[str]:
    """The engine's cap flag and value, or nothing when the route has no cap (the engine's default)."""
    return [] if value is None else [flag, str(value)]


NATIVE_APIS = frozenset({"messages", "count_tokens", "responses", "tokenize"})
"""The protocols an engine may serve natively: /v1/messages, /v1/messages/count_tokens,
/v1/responses (+ by id), /tokenize + /detokenize in vLLM's shapes."""
MAX_MODELS = 32
"""Models kept per backend from its /v1/models (the rest are ignored): the bound on
gateway_backend_model_info's series and on what one engine can add to the gateway's /v1/models."""
_MAX_MODEL_ID = 256

KeyPath = tuple[str, ...]


def _window_at(doc: Any, paths: Sequence[KeyPath]) -> int | None:
    """The first positive int found under one of the key paths, else None."""
    for path in paths:
        value = doc
        for key in path:
            value = value.get(key) if isinstance(value, Mapping) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


@dataclass(frozen=True, slots=True)
class ModelsTable:
    """How one engine says what it serves: the ids in `/v1/models`' `data`, each one's context window
    under `window_keys`, or one window for the whole backend under `info_window` in the answer to
    `info_path` (which wins: llama.cpp's /props has the per-slot window)."""

    path: str = "/v1/models"
    window_keys: tuple[KeyPath, ...] = (("max_model_len",),)
    info_path: str | None = None
    info_window: tuple[KeyPath, ...] = ()
    any_model: bool = False
    """The engine answers to any model name, whatever it lists (llama.cpp)."""

    def calls(self) -> tuple[ModelsCall, ...]:
        return (ModelsCall(self.path),) + ((ModelsCall(self.info_path),) if self.info_path else ())

    def parse(self, answers: Sequence[Any], owner: str) -> tuple[ServedModel, ...] | None:
        """At most MAX_MODELS models, once each, in the engine's order; None when the first answer is not
        an OpenAI model list. A failed info call (None) leaves the per-model windows."""
        doc = answers[0] if answers else None
        data = doc.get("data") if isinstance(doc, Mapping) else None
        if not isinstance(data, list):
            return None
        shared = _window_at(answers[1], self.info_window) if self.info_path and len(answers) > 1 else None
        out: list[ServedModel] = []
        seen: set[str] = set()
        for entry in data:
            model_id = entry.get("id") if isinstance(entry, Mapping) else None
            if not isinstance(model_id, str) or not model_id or len(model_id) > _MAX_MODEL_ID or model_id in seen:
                continue
            seen.add(model_id)
            assert isinstance(entry, Mapping)
            owned = entry.get("owned_by")
            window = shared or _window_at(entry, self.window_keys)
            out.append(ServedModel(model_id, owned if isinstance(owned, str) and owned else owner, window))
            if len(out) == MAX_MODELS:
                break
        return tuple(out)


DEFAULT_MODELS = ModelsTable()


@dataclass(frozen=True, slots=True)
class TableAdapter:
    """An EngineAdapter made of one engine's table."""

    kind: str
    health_path: str
    metrics_path: str
    load: LoadTable = NO_LOAD
    tokenizer: Tokenizer = NO_TOKENIZER
    launch: Callable[[LaunchSpec], list[str]] = no_launch
    error_hints: tuple[tuple[str, str], ...] = ()
    """(lower-case phrase, advice): an engine error holding the phrase gets the advice appended, for
    refusals whose cure is an engine flag (vLLM without a tool-call parser)."""
    client_faults: tuple[str, ...] = ()
    """Lower-case phrases that make an engine's 5xx the client's fault (a 400), e.g. a JSON parse error."""
    native_apis: frozenset[str] = frozenset()
    """The client protocols the engine serves itself, among NATIVE_APIS: their bytes pass through
    (errors still normalised); the rest are translated to chat completions."""
    native_fixes: frozenset[str] = frozenset()
    """What the gateway rewrites in a native body because this engine's own handling of it is known
    to break an agent (docs/agents.md): "fold_system" (a `system` message inside Messages'
    `messages`), "thinking_enabled" (Messages' adaptive thinking, which the engine does not read)."""
    models: ModelsTable = DEFAULT_MODELS
    """What the engine serves and its context window (docs/routing.md, "Model discovery")."""

    @property
    def models_calls(self) -> Sequence[ModelsCall]:
        return self.models.calls()

    def parse_models(self, answers: Sequence[Any]) -> tuple[ServedModel, ...] | None:
        return self.models.parse(answers, self.kind)

    @property
    def any_model(self) -> bool:
        return self.models.any_model

    def parse_load(self, metrics_text: str, now: float) -> EngineLoad:
        return self.load.parse(metrics_text, now)

    def tokenize_calls(self, model: str, messages: Messages, prompt: str | None) -> Sequence[TokenizeCall]:
        return self.tokenizer.calls(model, messages, prompt)

    def next_tokenize_call(self, responses: Sequence[Any]) -> TokenizeCall | None:
        return self.tokenizer.follow_up(responses)

    def count_tokens(self, responses: Sequence[Any]) -> int | None:
        return self.tokenizer.count(responses)

    def normalise_error(self, status: int, body: bytes) -> NormalisedError:
        error = normalise_error(status, body, self.client_faults)
        lower = error.message.lower()
        for phrase, advice in self.error_hints:
            if phrase in lower:
                return dataclasses.replace(error, message=f"{error.message} ({advice})")
        return error

    def launch_argv(self, spec: LaunchSpec) -> list[str]:
        return self.launch(spec)


@dataclass(frozen=True, slots=True)
class MessagesTokenizer:
    """POST /tokenize that renders chat messages with the model's own template, so one call counts a chat or
    a prompt: vLLM, SGLang and NIM 2.x."""

    def calls(self, model: str, messages: Messages, prompt: str | None) -> Sequence[TokenizeCall]:
        if messages is not None:
            body = {"model": model, "messages": list(messages), "add_generation_prompt": True}
            return (TokenizeCall("/tokenize", body),)
        if prompt is not None:
            return (TokenizeCall("/tokenize", {"model": model, "prompt": prompt}),)
        return ()

    def follow_up(self, responses: Sequence[Any]) -> TokenizeCall | None:
        return None

    def count(self, responses: Sequence[Any]) -> int | None:
        return count_field(responses[-1], "count") if responses else None
