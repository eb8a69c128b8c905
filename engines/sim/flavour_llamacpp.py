"""llama.cpp's shapes for the simulator, as recorded from a real llama-server (tests/fixtures/llamacpp/):
flat-ish errors with extra context fields, a 500 for malformed JSON, ``timings``, usage on the final chunk
of a completions stream, ``/tokenize {"content"}``, ``/slots`` and its Ollama-style ``/v1/models``."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any, ClassVar

from engines.sim.flavours import Gen, JsonObj, OpenAIFlavour, Reply
from engines.sim.model import SimSequence
from engines.sim.text import VOCAB, tokenize

FINGERPRINT = "b0-sim"  # the real one is the build, e.g. b1-7e4c0a9


class LlamacppFlavour(OpenAIFlavour):
    name: ClassVar[str] = "llamacpp"
    json_type: ClassVar[str] = "application/json; charset=utf-8"
    sse_type: ClassVar[str] = "text/event-stream"
    completion_id_prefix: ClassVar[str] = "chatcmpl-"  # llama-server uses it for /v1/completions too
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
        return 404, {"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}}

    def method_not_allowed(self) -> Reply:
        return 405, self.error(405, "Method Not Allowed", "invalid_request_error")

    def malformed_json(self, exc: json.JSONDecodeError) -> Reply:
        # nlohmann::json's exception, which this build answers with a 500 (a source build sends 400).
        at_end = exc.pos >= len(exc.doc)
        reason = "unexpected end of input; expected '[', '{', or a literal" if at_end else exc.msg
        msg = (
            f"[json.exception.parse_error.101] parse error at line {exc.lineno}, column {exc.colno}: "
            f"syntax error while parsing value - {reason}"
        )
        return 500, self.error(500, msg)

    def too_long(self, prompt: int, wanted: int) -> JsonObj:
        n_ctx = self.params.context_limit
        msg = f"request ({prompt} tokens) exceeds the available context size ({n_ctx} tokens), try increasing it"
        body = self.error(400, msg, "exceed_context_size_error")
        body["error"] |= {"n_prompt_tokens": prompt, "n_ctx": n_ctx}
        return body

    def health(self) -> tuple[str | None, bytes]:
        return self.json_type, b'{"status":"ok"}'

    def models(self) -> JsonObj:
        name = self.params.model
        details = {
            "parent_model": "",
            "format": "gguf",
            "family": "",
            "families": [""],
            "parameter_size": "",
            "quantization_level": "",
        }
        ollama = {"name": name, "model": name, "modified_at": "", "size": "", "digest": "", "type": "model",
                  "description": "", "tags": [""], "capabilities": ["completion"], "parameters": "",
                  "details": details}  # fmt: skip
        n_ctx = self.params.context_limit
        meta = {"vocab_type": 2, "n_vocab": VOCAB, "n_ctx": n_ctx, "n_ctx_train": n_ctx, "n_embd": 0,
                "n_params": 0, "size": 0, "ftype": "sim"}  # fmt: skip
        model = {"id": name, "aliases": [name], "tags": [], "object": "model", "created": int(time.time()),
                 "owned_by": "llamacpp", "meta": meta}  # fmt: skip
        return {"models": [ollama], "object": "list", "data": [model]}

    def tokenize(self, body: JsonObj) -> Reply:
        if not isinstance(body.get("content"), str):
            return 400, self.error(400, '"content" must be a string')
        return 200, {"tokens": tokenize(body["content"])}

    def detokenized(self, text: str) -> JsonObj:
        return {"content": text}

    def props(self) -> JsonObj:
        """The real /props' keys that say what it serves: the per-slot window (the real one's is -c divided
        by --parallel), the slot count, the alias and the model path (here both the model name)."""
        name = self.params.model
        return {
            "default_generation_settings": {"n_ctx": self.params.context_limit},
            "total_slots": self.params.max_batch,
            "model_alias": name,
            "model_path": name,
        }

    def slots(self, running: Sequence[SimSequence]) -> list[JsonObj]:
        """One entry per slot; running sequences fill the first ones. A slot without a task has only the
        first four keys (the real one keeps its last task's after it ends; the simulator forgets it)."""
        out: list[JsonObj] = []
        for i in range(self.params.max_batch):
            slot: JsonObj = {"id": i, "n_ctx": self.params.context_limit, "speculative": False}
            seq = running[i] if i < len(running) else None
            slot["is_processing"] = seq is not None
            if seq is not None:
                next_token = {"has_next_token": True, "has_new_line": False,
                              "n_remain": seq.max_tokens - seq.generated, "n_decoded": seq.generated}  # fmt: skip
                slot |= {"id_task": seq.seq_id, "n_prompt_tokens": seq.prompt_tokens,
                         "n_prompt_tokens_processed": seq.prompt_tokens - seq.cached_tokens,
                         "n_prompt_tokens_cache": seq.cached_tokens, "next_token": [next_token]}  # fmt: skip
            out.append(slot)
        return out

    def usage(self, g: Gen) -> JsonObj:
        return {
            "completion_tokens": g.completion_tokens,
            "prompt_tokens": g.prompt_tokens,
            "total_tokens": g.prompt_tokens + g.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": g.cached_tokens},
        }

    def timings(self, g: Gen) -> JsonObj:
        prompt_n = g.prompt_tokens - g.cached_tokens
        prompt_ms, predicted_ms = g.prompt_s * 1000, g.decode_s * 1000
        return {
            "cache_n": g.cached_tokens,
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": prompt_n / g.prompt_s if g.prompt_s else 0.0,
            "predicted_n": g.completion_tokens,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / g.completion_tokens if g.completion_tokens else 0.0,
            "predicted_per_second": g.completion_tokens / g.decode_s if g.decode_s else 0.0,
        }

    def _envelope(self, g: Gen, chunk: bool) -> JsonObj:
        if chunk and g.chat:
            return {"created": g.created, "id": g.id, "model": g.model, "system_fingerprint": FINGERPRINT,
                    "object": g.object + ".chunk"}  # fmt: skip
        return {"created": g.created, "model": g.model, "system_fingerprint": FINGERPRINT, "object": g.object}

    def _choice(self, g: Gen, text: str | None, finish: str | None, chunk: bool) -> JsonObj:
        if not g.chat:
            return {"text": text or "", "index": 0, "logprobs": None, "finish_reason": finish}
        if chunk:
            return {"finish_reason": finish, "index": 0, "delta": {} if text is None else {"content": text}}
        return {"finish_reason": finish, "index": 0, "message": {"role": "assistant", "content": text}}

    def _event(self, g: Gen, choices: list[JsonObj], **tail: Any) -> JsonObj:
        # Chat chunks carry the id in the envelope; the rest put it after the usage, before the timings.
        event = {"choices": choices, **self._envelope(g, True)}
        if g.chat:
            return event | tail
        timings = tail.pop("timings", None)
        event |= tail | {"id": g.id}
        return event if timings is None else event | {"timings": timings}

    def open_events(self, g: Gen) -> list[JsonObj]:
        if not g.chat:
            return []
        return [self._event(g, [{"finish_reason": None, "index": 0, "delta": {"role": "assistant", "content": None}}])]

    def token_event(self, g: Gen, text: str, finish: str | None) -> JsonObj:
        return self._event(g, [self._choice(g, text, finish, True)])

    def close_events(self, g: Gen, finish: str) -> list[JsonObj]:
        last = [self._choice(g, None, finish, True)]
        if not g.chat:
            # llama.cpp's /v1/completions stream always carries usage on its final chunk.
            return [self._event(g, last, usage=self.usage(g), timings=self.timings(g))]
        if not g.include_usage:
            return [self._event(g, last, timings=self.timings(g))]
        return [self._event(g, last), self._event(g, [], usage=self.usage(g), timings=self.timings(g))]

    def response(self, g: Gen, text: str, finish: str) -> JsonObj:
        return {
            "choices": [self._choice(g, text, finish, False)],
            **self._envelope(g, False),
            "usage": self.usage(g),
            "id": g.id,
            "timings": self.timings(g),
        }
