"""What every engine adapter provides: the EngineAdapter protocol, the EngineLoad it scrapes,
and the LaunchSpec it turns into a launch command. Nothing here does I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """One scrape of a backend's own /metrics, under our names. None means the engine lacks it."""

    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    """Fraction of the KV cache in use, 0..1."""
    prefix_hit_rate: float | None = None
    """Cumulative prefix-cache hits / queries (0..1) since the engine started."""
    scraped_at: float = 0.0
    """time.monotonic() of the scrape."""

    def signals(self) -> dict[str, float]:
        out = {}
        for key in ("running", "waiting", "kv_usage", "prefix_hit_rate"):
            value = getattr(self, key)
            if value is not None:
                out[key] = float(value)
        return out


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """What `gateway plan` knows about one backend: enough to print the engine's launch command."""

    model: str
    host: str
    port: int
    max_context_tokens: int | None
    parallel: int = 4
    extra: Mapping[str, Any] = field(default_factory=dict)
    served_name: str | None = None
    """The name the engine should answer to (the backend's `model:`), when it is not the model path."""


@dataclass(frozen=True, slots=True)
class ServedModel:
    """One model an engine says it serves (its `/v1/models`), with its context window where the engine
    reports one (tokens per request: vLLM's max_model_len, llama.cpp's per-slot n_ctx)."""

    id: str
    owned_by: str
    window: int | None = None


@dataclass(frozen=True, slots=True)
class ModelsCall:
    """One GET the gateway makes to learn what an engine serves: `path`, read as JSON."""

    path: str


@dataclass(frozen=True, slots=True)
class NormalisedError:
    """An engine error turned into the one OpenAI shape."""

    status: int
    message: str
    type: str
    code: str | None
    param: str | None = None

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True, slots=True)
class TokenizeCall:
    """One HTTP call to an engine's tokenizer: POST `path` with `json` and keep the JSON answer."""

    path: str
    json: Mapping[str, Any]


class EngineAdapter(Protocol):
    """Counting tokens may take a dependent second call (llama.cpp renders the chat template, then
    tokenizes the result), so the caller loops:

        answers = [await post(c) for c in adapter.tokenize_calls(model, messages, prompt)]
        while (call := adapter.next_tokenize_call(answers)) is not None:
            answers.append(await post(call))
        count = adapter.count_tokens(answers)   # None: estimate instead
    """

    # Read-only, so frozen (immutable) adapter objects satisfy the protocol.
    @property
    def kind(self) -> str: ...

    @property
    def health_path(self) -> str: ...

    @property
    def native_apis(self) -> frozenset[str]:
        """The client protocols it serves itself ("messages", "count_tokens", "responses", "tokenize")."""
        ...

    @property
    def native_fixes(self) -> frozenset[str]:
        """Rewrites a native body needs on this engine ("fold_system", "thinking_enabled")."""
        ...

    @property
    def metrics_path(self) -> str:
        """Where the engine's Prometheus text lives; "" when it has none (don't scrape)."""
        ...

    def parse_load(self, metrics_text: str, now: float) -> EngineLoad: ...

    def tokenize_calls(
        self, model: str, messages: Sequence[Mapping[str, Any]] | None, prompt: str | None
    ) -> Sequence[TokenizeCall]:
        """The calls that give an exact prompt token count; empty when the engine can't count."""
        ...

    def next_tokenize_call(self, responses: Sequence[Any]) -> TokenizeCall | None:
        """A call that needs the JSON answers so far, in order; None when there is nothing more to ask."""
        ...

    def count_tokens(self, responses: Sequence[Any]) -> int | None:
        """The token count from all the JSON answers (tokenize_calls, then next_tokenize_call), in order."""
        ...

    def normalise_error(self, status: int, body: bytes) -> NormalisedError:
        """Any error body this engine sends, as one OpenAI-shaped error with the right status."""
        ...

    def launch_argv(self, spec: LaunchSpec) -> list[str]: ...

    @property
    def models_calls(self) -> Sequence[ModelsCall]:
        """The GETs that tell what the engine serves: `/v1/models` first, then any info endpoint."""
        ...

    def parse_models(self, answers: Sequence[Any]) -> tuple[ServedModel, ...] | None:
        """The served models from the JSON answers to models_calls (None for a failed call), in order;
        None when the first answer is not a model list."""
        ...

    @property
    def any_model(self) -> bool:
        """The engine answers to any model name (llama.cpp): exact servers of a name are preferred."""
        ...
