"""The simulator's shapes: error bodies, length checks, health, models, tokenize, and the JSON of completions
and their SSE chunks. ``OpenAIFlavour`` holds the shapes the OpenAI-compatible engines share, which is what
SGLang sends; vLLM 0.32's are in ``sim_flavour_vllm``, llama.cpp's in ``sim_flavour_llamacpp``, each checked
against recordings of the real engine (tests/sim/test_sim_fixtures.py)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from engines.sim.model import SimParams
from engines.sim.text import render_chat, tokenize

JsonObj = dict[str, Any]
Reply = tuple[int, JsonObj]


@dataclass
class Gen:
    """What a completion's JSON needs to know about one request."""

    id: str
    chat: bool
    model: str
    include_usage: bool = False
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    prompt_s: float = 0.0  # time to first token, for llama.cpp's "timings"
    decode_s: float = 0.0
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"


class OpenAIFlavour:
    """The shapes every flavour starts from; each overrides what differs."""

    name: ClassVar[str] = "openai"
    finish_on_last_token: ClassVar[bool] = False  # True: finish_reason on the last content chunk
    json_type: ClassVar[str] = "application/json"
    sse_type: ClassVar[str] = "text/event-stream; charset=utf-8"
    completion_id_prefix: ClassVar[str] = "cmpl-"  # chat completions' ids start with "chatcmpl-"
    _types: ClassVar[dict[int, str]] = {
        400: "BadRequestError",
        401: "UnauthorizedError",
        404: "NotFoundError",
        429: "TooManyRequestsError",
        503: "ServiceUnavailableError",
    }

    def __init__(self, params: SimParams) -> None:
        self.params = params

    def error(self, status: int, message: str, type_: str | None = None, param: str | None = None) -> JsonObj:
        return {
            "error": {
                "message": message,
                "type": type_ or self._types.get(status, "InternalServerError"),
                "param": param,
                "code": status,
            }
        }

    def not_found(self) -> Reply:
        return 404, {"detail": "Not Found"}  # FastAPI's own 404, not the OpenAI shape

    def method_not_allowed(self) -> Reply:
        return 405, {"detail": "Method Not Allowed"}

    def malformed_json(self, exc: json.JSONDecodeError) -> Reply:
        return 400, self.error(400, f"JSON decode error: {exc}")

    def missing(self, field_name: str, body: JsonObj) -> Reply:
        """A required field is absent from the request body."""
        return 400, self.error(400, f"'{field_name}' is required")

    def unknown_model(self, model: Any) -> Reply | None:
        """The reply to a request for a model this backend does not serve; None: answer it anyway."""
        return None

    def too_long(self, prompt: int, wanted: int) -> JsonObj:
        """The error body for a prompt that leaves no room for one output token."""
        limit = self.params.context_limit
        msg = f"The input ({prompt} tokens) is longer than the model's context length ({limit} tokens)."
        return self.error(400, msg)

    def check_length(self, prompt: int, max_tokens: int | None) -> tuple[int, Reply | None]:
        """(max_tokens to generate, or an error reply). Output that would not fit is clamped."""
        limit = self.params.context_limit
        wanted = self.params.default_max_tokens if max_tokens is None else max_tokens
        if prompt + 1 > limit:
            return 0, (400, self.too_long(prompt, wanted))
        return min(wanted, limit - prompt), None

    def version(self) -> JsonObj | None:
        """``GET /version``'s body, or None where the engine has no such endpoint."""
        return None

    def health(self) -> tuple[str | None, bytes]:
        return None, b""

    def models(self) -> JsonObj:
        return {
            "object": "list",
            "data": [
                {
                    "id": self.params.model,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": self.name,
                    "root": self.params.model,
                    "max_model_len": self.params.context_limit,
                }
            ],
        }

    def tokenize(self, body: JsonObj) -> Reply:
        """vLLM's ``/tokenize``: ``{"prompt"}`` or ``{"messages", "add_generation_prompt"}``. SGLang's is
        taken to be the same (its API has varied across versions)."""
        try:
            if "messages" in body:
                text = render_chat(body["messages"], bool(body.get("add_generation_prompt", True)), body.get("tools"))
            elif isinstance(body.get("prompt"), str):
                text = body["prompt"]
            else:
                raise ValueError("either 'prompt' (a string) or 'messages' is required")
        except (ValueError, TypeError) as exc:
            return 400, self.error(400, str(exc))
        ids = tokenize(text)
        return 200, {"count": len(ids), "max_model_len": self.params.context_limit, "tokens": ids}

    def detokenized(self, text: str) -> JsonObj:
        """The /detokenize answer: SGLang's says "text" (vLLM's "prompt", llama.cpp's "content")."""
        return {"text": text}

    def usage(self, g: Gen) -> JsonObj:
        return {
            "prompt_tokens": g.prompt_tokens,
            "total_tokens": g.prompt_tokens + g.completion_tokens,
            "completion_tokens": g.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": g.cached_tokens},
        }

    def _envelope(self, g: Gen, chunk: bool) -> JsonObj:
        return {
            "id": g.id,
            "object": g.object + (".chunk" if chunk and g.chat else ""),
            "created": g.created,
            "model": g.model,
        }

    def _choice(self, g: Gen, text: str | None, finish: str | None, chunk: bool) -> JsonObj:
        if not g.chat:
            return {
                "index": 0,
                "text": text or "",
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
        if chunk:
            return {
                "index": 0,
                "delta": {} if text is None else {"content": text},
                "logprobs": None,
                "finish_reason": finish,
            } | ({"stop_reason": None} if finish else {})
        return {
            "index": 0,
            "message": {"role": "assistant", "content": text, "tool_calls": [], "reasoning_content": None},
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": None,
        }

    def open_events(self, g: Gen) -> list[JsonObj]:
        """Events sent just before the first content chunk (the chat role chunk)."""
        if not g.chat:
            return []
        first = self._envelope(g, True)
        first["choices"] = [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ]
        return [first]

    def token_event(self, g: Gen, text: str, finish: str | None) -> JsonObj:
        return self._envelope(g, True) | {"choices": [self._choice(g, text, finish, True)]}

    def close_events(self, g: Gen, finish: str) -> list[JsonObj]:
        """Events after the last content chunk, before ``data: [DONE]``."""
        if not g.include_usage:
            return []
        return [self._envelope(g, True) | {"choices": [], "usage": self.usage(g)}]

    def response(self, g: Gen, text: str, finish: str) -> JsonObj:
        return self._envelope(g, False) | {
            "choices": [self._choice(g, text, finish, False)],
            "usage": self.usage(g),
            "prompt_logprobs": None,
        }


class SglangFlavour(OpenAIFlavour):
    """SGLang: flat errors, a 400 for prompt + max_tokens over the limit, no model-name check (the base's
    ``unknown_model``), and ``matched_stop`` and ``usage: null`` on stream chunks."""

    name: ClassVar[str] = "sglang"

    def error(self, status: int, message: str, type_: str | None = None, param: str | None = None) -> JsonObj:
        # SGLang's errors are flat, not nested under "error".
        return {
            "object": "error",
            "message": message,
            "type": type_ or self._types.get(status, "InternalServerError"),
            "param": param,
            "code": status,
        }

    def check_length(self, prompt: int, max_tokens: int | None) -> tuple[int, Reply | None]:
        limit = self.params.context_limit
        if prompt + 1 > limit:
            return 0, (400, self.too_long(prompt, max_tokens or 0))
        if max_tokens is not None and prompt + max_tokens > limit:
            msg = (
                f"Requested token count exceeds the model's maximum context length of {limit} tokens. You "
                f"requested a total of {prompt + max_tokens} tokens: {prompt} tokens from the input "
                f"messages and {max_tokens} tokens for the completion. Please reduce the number of tokens in "
                "the input messages or the completion to fit within the limit."
            )
            return 0, (400, self.error(400, msg))
        wanted = self.params.default_max_tokens if max_tokens is None else max_tokens
        return min(wanted, limit - prompt), None

    def token_event(self, g: Gen, text: str, finish: str | None) -> JsonObj:
        event = super().token_event(g, text, finish)
        event["choices"][0]["matched_stop"] = None
        return event | {"usage": None}

    def close_events(self, g: Gen, finish: str) -> list[JsonObj]:
        last = self._envelope(g, True) | {"choices": [self._choice(g, None, finish, True)], "usage": None}
        last["choices"][0]["matched_stop"] = None
        return [last, *super().close_events(g, finish)]
