"""llama.cpp's shapes for the simulator: flat-ish errors with extra context fields, ``timings``, usage on
the final chunk of a completions stream, ``/tokenize {"content"}`` and ``/slots``."""

from __future__ import annotations

import time
from typing import Any, ClassVar

from engines.sim_flavours import Gen, JsonObj, Reply, VllmFlavour
from engines.sim_text import VOCAB, tokenize


class LlamacppFlavour(VllmFlavour):
    name: ClassVar[str] = "llamacpp"
    finish_on_last_token: ClassVar[bool] = False
    _types: ClassVar[dict[int, str]] = {
        400: "invalid_request_error",
        401: "authentication_error",
        404: "not_found_error",
        501: "not_supported_error",
        503: "unavailable_error",
    }

    def error(self, status: int, message: str, type_: str | None = None, param: str | None = None) -> JsonObj:
        return {
            "error": {
                "code": status,
                "message": message,
                "type": type_ or self._types.get(status, "server_error"),
            }
        }

    def not_found(self) -> Reply:
        return 404, self.error(404, "File Not Found")

    def method_not_allowed(self) -> Reply:
        return 405, self.error(405, "Method Not Allowed", "invalid_request_error")

    def unknown_model(self, model: Any) -> Reply | None:
        return None

    def check_length(self, prompt: int, max_tokens: int | None) -> tuple[int, Reply | None]:
        n_ctx = self.params.context_limit
        if prompt + 1 > n_ctx:
            body = self.error(
                400,
                f"request ({prompt} tokens) exceeds the available context size ({n_ctx} tokens), try increasing it",
                "exceed_context_size_error",
            )
            body["error"] |= {"n_prompt_tokens": prompt, "n_ctx": n_ctx}
            return 0, (400, body)
        # llama.cpp silently clamps a huge max_tokens to what the slot has left.
        return min(self.params.default_max_tokens if max_tokens is None else max_tokens, n_ctx - prompt), None

    def health(self) -> tuple[str | None, bytes]:
        return "application/json", b'{"status":"ok"}'

    def models(self) -> JsonObj:
        return {
            "object": "list",
            "data": [
                {
                    "id": self.params.model,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "llamacpp",
                    "meta": {"vocab_type": 2, "n_vocab": VOCAB, "n_ctx_train": self.params.context_limit},
                }
            ],
        }

    def tokenize(self, body: JsonObj) -> Reply:
        if not isinstance(body.get("content"), str):
            return 400, self.error(400, '"content" must be a string')
        return 200, {"tokens": tokenize(body["content"])}

    def timings(self, g: Gen) -> JsonObj:
        prompt_n = g.prompt_tokens - g.cached_tokens
        return {
            "cache_n": g.cached_tokens,
            "prompt_n": prompt_n,
            "prompt_ms": g.prompt_s * 1000,
            "prompt_per_second": prompt_n / g.prompt_s if g.prompt_s else 0.0,
            "predicted_n": g.completion_tokens,
            "predicted_ms": g.decode_s * 1000,
            "predicted_per_second": g.completion_tokens / g.decode_s if g.decode_s else 0.0,
        }

    def _envelope(self, g: Gen, chunk: bool) -> JsonObj:
        return {
            "created": g.created,
            "model": g.model,
            "system_fingerprint": "b0-sim",
            "object": g.object + (".chunk" if chunk and g.chat else ""),
            "id": g.id,
        }

    def _choice(self, g: Gen, text: str | None, finish: str | None, chunk: bool) -> JsonObj:
        if not g.chat:
            return {"text": text or "", "index": 0, "logprobs": None, "finish_reason": finish}
        if chunk:
            return {"finish_reason": finish, "index": 0, "delta": {} if text is None else {"content": text}}
        return {"finish_reason": finish, "index": 0, "message": {"role": "assistant", "content": text}}

    def open_events(self, g: Gen) -> list[JsonObj]:
        if not g.chat:
            return []
        return [
            {"choices": [{"finish_reason": None, "index": 0, "delta": {"role": "assistant", "content": None}}]}
            | self._envelope(g, True)
        ]

    def token_event(self, g: Gen, text: str, finish: str | None) -> JsonObj:
        return {"choices": [self._choice(g, text, finish, True)]} | self._envelope(g, True)

    def close_events(self, g: Gen, finish: str) -> list[JsonObj]:
        last = {"choices": [self._choice(g, None, finish, True)]} | self._envelope(g, True)
        if not g.chat:
            # llama.cpp's /v1/completions stream always carries usage on its final chunk.
            return [last | {"usage": self.usage(g), "timings": self.timings(g)}]
        if not g.include_usage:
            return [last]
        return [
            last,
            {"choices": [], **self._envelope(g, True), "usage": self.usage(g), "timings": self.timings(g)},
        ]

    def response(self, g: Gen, text: str, finish: str) -> JsonObj:
        return {
            "choices": [self._choice(g, text, finish, False)],
            **self._envelope(g, False),
            "usage": self.usage(g),
            "timings": self.timings(g),
        }
