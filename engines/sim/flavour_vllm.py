"""vLLM 0.32's shapes for the simulator, as recorded from the real server (tests/fixtures/vllm/): every key it
sends, with the null or zero it sends when the feature is unused; pydantic's validation errors; the 400 for
``max_tokens`` alone above ``max_model_len``; ``/version``."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, ClassVar

from engines.sim.flavours import Gen, JsonObj, OpenAIFlavour, Reply

VERSION = "0.32.0+sim"  # the release whose shapes these are, marked as a simulator
FINGERPRINT = "vllm-sim"  # the real one is vllm-<version>-<commit>


def _validation_error(kind: str, loc: str, msg: str, items: int, **extra: Any) -> str:
    # pydantic's text, as vLLM 0.32 passes it on: a Python dict repr.
    detail = {"type": kind, "loc": loc, "msg": msg, "input": f"<dict of {items} items>", **extra}
    return f"1 validation error:\n  {detail}"


def _without_nulls(obj: JsonObj) -> JsonObj:
    """What vLLM's streamed usage leaves out: null fields, here and one level down."""
    return {k: _without_nulls(v) if isinstance(v, dict) else v for k, v in obj.items() if v is not None}


class VllmFlavour(OpenAIFlavour):
    name: ClassVar[str] = "vllm"
    finish_on_last_token: ClassVar[bool] = True

    def malformed_json(self, exc: json.JSONDecodeError) -> Reply:
        loc = f"body.{exc.pos}"
        msg = _validation_error("json_invalid", loc, "JSON decode error", 0, ctx={"error": exc.msg})
        return 400, self.error(400, msg, "Bad Request", loc)

    def missing(self, field_name: str, body: JsonObj) -> Reply:
        loc = f"body.{field_name}"
        return 400, self.error(400, _validation_error("missing", loc, "Field required", len(body)), "Bad Request", loc)

    def unknown_model(self, model: Any) -> Reply | None:
        if model in (None, self.params.model):
            return None
        msg = f"The model `{model}` does not exist. Valid aliases: {self.params.model}."
        return 404, self.error(404, msg, "NotFoundError", "model")

    def too_long(self, prompt: int, wanted: int) -> JsonObj:
        limit = self.params.context_limit
        seen = min(prompt, limit + 1)  # vLLM stops tokenizing one token past the limit
        msg = (
            f"This model's maximum context length is {limit} tokens. However, your prompt contains at least "
            f"{seen} input tokens, which exceeds this limit even without any output tokens. Please reduce the "
            f"length of the input prompt. (parameter=input_tokens, value={seen})"
        )
        return self.error(400, msg, "BadRequestError", "input_tokens")

    def check_length(self, prompt: int, max_tokens: int | None) -> tuple[int, Reply | None]:
        """``max_tokens`` alone above the limit is a 400; prompt + ``max_tokens`` above it is clamped."""
        limit = self.params.context_limit
        if max_tokens is not None and max_tokens > limit:
            msg = (
                f"max_tokens={max_tokens} cannot be greater than max_model_len={limit}. Please request fewer "
                f"output tokens. (parameter=max_tokens, value={max_tokens})"
            )
            return 0, (400, self.error(400, msg, "BadRequestError", "max_tokens"))
        return super().check_length(prompt, max_tokens)

    def version(self) -> JsonObj | None:
        return {"version": VERSION}

    def models(self) -> JsonObj:
        created = int(time.time())
        permission = {
            "id": f"modelperm-{uuid.uuid4().hex[:16]}",
            "object": "model_permission",
            "created": created,
            "allow_create_engine": False,
            "allow_sampling": True,
            "allow_logprobs": True,
            "allow_search_indices": False,
            "allow_view": True,
            "allow_fine_tuning": False,
            "organization": "*",
            "group": None,
            "is_blocking": False,
        }
        model = {
            "id": self.params.model,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": self.params.model,
            "parent": None,
            "max_model_len": self.params.context_limit,
            "permission": [permission],
        }
        return {"object": "list", "data": [model]}

    def tokenize(self, body: JsonObj) -> Reply:
        status, reply = super().tokenize(body)
        return status, (reply | {"token_strs": None} if status == 200 else reply)

    def detokenized(self, text: str) -> JsonObj:
        return {"prompt": text}

    def usage(self, g: Gen) -> JsonObj:
        details = {
            "cached_tokens": g.cached_tokens,
            "created_cache_tokens": 0 if g.chat else None,
            "multimodal_tokens": None,
        }
        return super().usage(g) | {"prompt_tokens_details": details, "completion_tokens_details": None}

    def _choice(self, g: Gen, text: str | None, finish: str | None, chunk: bool) -> JsonObj:
        ended = {"logprobs": None, "finish_reason": finish, "stop_reason": None}
        if not g.chat:
            if chunk:
                return {"index": 0, "text": text or "", **ended, "prompt_token_ids": None, "token_ids": None}
            tail = {"token_ids": None, "prompt_logprobs": None, "prompt_token_ids": None, "routed_experts": None}
            return {"index": 0, "text": text or "", **ended, **tail}
        if chunk:
            delta = {} if text is None else {"content": text}
            if finish is None:
                del ended["stop_reason"]  # only the finishing chunk has one
            return {"index": 0, "delta": delta, **ended, "token_ids": None}
        message = {"role": "assistant", "content": text}
        message |= dict.fromkeys(("refusal", "annotations", "audio", "function_call", "reasoning"))
        return {"index": 0, "message": message, **ended, "token_ids": None, "routed_experts": None}

    def open_events(self, g: Gen) -> list[JsonObj]:
        events = super().open_events(g)
        for event in events:
            event |= {"prompt_token_ids": None, "prompt_text": None}
        return events

    def token_event(self, g: Gen, text: str, finish: str | None) -> JsonObj:
        event = super().token_event(g, text, finish)
        if finish is not None and not g.include_usage:
            event["system_fingerprint"] = FINGERPRINT  # else it goes on the usage chunk
        return event

    def close_events(self, g: Gen, finish: str) -> list[JsonObj]:
        if not g.include_usage:
            return []
        usage = _without_nulls(self.usage(g))
        return [self._envelope(g, True) | {"choices": [], "usage": usage, "system_fingerprint": FINGERPRINT}]

    def response(self, g: Gen, text: str, finish: str) -> JsonObj:
        body = self._envelope(g, False) | {
            "choices": [self._choice(g, text, finish, False)],
            "service_tier": None,
            "system_fingerprint": FINGERPRINT,
            "usage": self.usage(g),
        }
        if g.chat:
            body |= {"prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None}
        return body | {"kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}
