"""The simulator's native Anthropic Messages (POST /v1/messages, /v1/messages/count_tokens), for the
flavours whose real engine serves them (vLLM 0.32, SGLang 0.5, llama.cpp): the same batching engine as
chat, the shapes each engine was recorded sending (tests/fixtures/*/protocols, tests/fixtures/sglang/
proto_*; checked in tests/sim/test_sim_messages.py). Prompts are rendered as the chat they translate to,
so a native count equals /tokenize of the translated chat, as on the real engines."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any

from engines.sim.api import SimApi, dumps
from engines.sim.cache import block_hashes
from engines.sim.faults import Fault
from engines.sim.flavours import JsonObj, Reply
from engines.sim.http import ClientGone, HttpConn, HttpRequest
from engines.sim.model import SimSequence
from engines.sim.text import filler_text, filler_token, render_chat, tokenize


@dataclass(frozen=True)
class Shapes:
    """What differs between the engines' Messages answers."""

    id_prefix: str
    id_hex: int
    body_stop_sequence: bool  # the non-stream body has stop_sequence
    body_usage: tuple[str, ...]  # usage keys of the non-stream body
    start_stop_fields: bool  # message_start's message has stop_reason / stop_sequence
    start_usage: tuple[str, ...]
    delta_stop_sequence: bool
    delta_usage: tuple[str, ...]
    count_context_management: bool  # count_tokens adds {"context_management": {"original_input_tokens"}}
    count_refuses_long: bool  # count_tokens of a prompt over the context is a 400
    anthropic_errors: bool  # errors in Anthropic's envelope (with the engine's own types); else OpenAI's
    max_tokens_required: bool
    missing_in_anthropic_shape: bool = False  # SGLang: invalid_request_error "max_tokens: Field required"
    too_long_in_stream: bool = False  # SGLang: a stream that is too long is a 200: message_start, error, message_stop


_ALL = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
SHAPES = {
    "vllm": Shapes("chatcmpl-", 16, False, _ALL, True, _ALL[:2], True, _ALL, True, True, True, True),
    "llamacpp": Shapes(
        "chatcmpl-",
        32,
        True,
        ("cache_read_input_tokens", "input_tokens", "output_tokens"),
        True,
        ("cache_read_input_tokens", "input_tokens", "output_tokens"),
        True,
        ("output_tokens",),
        False,
        False,
        False,
        False,
    ),
    "sglang": Shapes(
        "msg_",
        32,
        False,
        _ALL[:2],
        False,
        ("input_tokens", "output_tokens", "cache_read_input_tokens"),
        False,
        ("output_tokens",),
        False,
        False,
        True,
        True,
        missing_in_anthropic_shape=True,
        too_long_in_stream=True,
    ),
}
_STOP = {"length": "max_tokens", "stop": "end_turn"}


def _chat(body: JsonObj) -> list[JsonObj]:
    """The Messages conversation as the chat messages it translates to (text only)."""
    out: list[JsonObj] = []
    system = body.get("system")
    if isinstance(system, list):
        system = "".join(b.get("text", "") for b in system if isinstance(b, dict))
    if system:
        out.append({"role": "system", "content": system})
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages: must be a non-empty list")
    out.extend(m for m in messages if isinstance(m, dict))
    return out


def _usage(keys: tuple[str, ...], prompt: int, cached: int, output: int) -> JsonObj:
    values = {
        "input_tokens": prompt - cached,
        "output_tokens": output,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }
    return {k: values[k] for k in keys}


class MessagesApi:
    """The two handlers, bound to one SimApi."""

    def __init__(self, api: SimApi) -> None:
        self.api = api
        self.shapes = SHAPES[api.params.flavour]

    def _error(self, status: int, message: str, type_: str = "BadRequestError") -> Reply:
        if self.shapes.anthropic_errors:
            return status, {"type": "error", "error": {"type": type_, "message": message}}
        return status, self.api.flavour.error(status, message)

    def _too_long(self, prompt: int) -> Reply:
        body = self.api.flavour.too_long(prompt, 0)
        if self.shapes.anthropic_errors:
            return self._error(400, _message(body))
        return 400, body

    def _prompt(self, body: JsonObj) -> list[int] | Reply:
        try:
            return tokenize(render_chat(_chat(body), True, body.get("tools")))
        except ValueError as exc:
            return self._error(400, str(exc))

    async def count_tokens(self, conn: HttpConn, req: HttpRequest, fault: Fault) -> None:
        body = self.api.parse_body(req)
        if isinstance(body, tuple):
            await self.api.send_json(conn, fault, *body)
            return
        ids = self._prompt(body)
        if isinstance(ids, tuple):
            await self.api.send_json(conn, fault, *ids)
            return
        if self.shapes.count_refuses_long and len(ids) + 1 > self.api.params.context_limit:
            await self.api.send_json(conn, fault, *self._too_long(len(ids)))
            return
        out: JsonObj = {"input_tokens": len(ids)}
        if self.shapes.count_context_management:
            out["context_management"] = {"original_input_tokens": len(ids)}
        await self.api.send_json(conn, fault, 200, out)

    async def messages(self, conn: HttpConn, req: HttpRequest, fault: Fault) -> None:
        api = self.api
        body = api.parse_body(req)
        if isinstance(body, tuple):
            await api.send_json(conn, fault, *body)
            return
        max_tokens = body.get("max_tokens")
        if max_tokens is None and self.shapes.max_tokens_required:
            if self.shapes.missing_in_anthropic_shape:
                missing = self._error(400, "max_tokens: Field required", "invalid_request_error")
            else:
                missing = api.flavour.missing("max_tokens", body)
            await api.send_json(conn, fault, *missing)
            return
        if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
            await api.send_json(conn, fault, *self._error(400, "max_tokens: must be an integer >= 1"))
            return
        ids = self._prompt(body)
        if isinstance(ids, tuple):
            await api.send_json(conn, fault, *ids)
            return
        allowed, too_long = api.flavour.check_length(len(ids), max_tokens)
        if too_long is not None:
            status, error = too_long
            in_stream = self.shapes.too_long_in_stream and body.get("stream") is True
            if self.shapes.anthropic_errors:
                kind = "invalid_request_error" if in_stream else "BadRequestError"
                too_long = self._error(status, _message(error), kind)
            if in_stream:
                await self._refuse_in_stream(conn, fault, too_long[1], body.get("model"))
                return
            await api.send_json(conn, fault, *too_long)
            return
        seq = SimSequence(
            prompt_tokens=len(ids),
            max_tokens=allowed,
            stop_after=fault.tokens,
            hashes=block_hashes(ids, api.params.block_size),
        )
        model = body.get("model") if isinstance(body.get("model"), str) else api.params.model
        message_id = self.shapes.id_prefix + uuid.uuid4().hex[: self.shapes.id_hex]
        event = api.engine.submit(seq)
        conn.wake_on_gone(event)
        try:
            if body.get("stream") is True:
                await self._stream(conn, fault, seq, event, message_id, model)
            else:
                await self._whole(conn, fault, seq, event, message_id, model)
        finally:
            api.engine.abort(seq)  # a no-op once finished; stops the work at once when the client left

    async def _refuse_in_stream(self, conn: HttpConn, fault: Fault, error: JsonObj, model: Any) -> None:
        """SGLang's way: the stream opens, then says what is wrong."""
        headers = [("content-type", self.api.flavour.sse_type), ("cache-control", "no-cache")]
        await conn.send_head(200, [*self.api.common_headers(conn, fault), *headers, ("transfer-encoding", "chunked")])
        start: JsonObj = {"id": self.shapes.id_prefix + uuid.uuid4().hex[: self.shapes.id_hex], "type": "message"}
        start |= {"role": "assistant", "content": [], "model": model, "usage": {"input_tokens": 0, "output_tokens": 0}}
        await _event(conn, "message_start", {"type": "message_start", "message": start})
        await asyncio.sleep(0.01)  # its own read: the relay must look past the preamble, not get lucky
        await _event(conn, "error", error)
        await _event(conn, "message_stop", {"type": "message_stop"})
        await conn.send_chunk(b"")

    async def _whole(
        self, conn: HttpConn, fault: Fault, seq: SimSequence, event: asyncio.Event, message_id: str, model: Any
    ) -> None:
        while seq.state in ("waiting", "running"):
            event.clear()
            if conn.gone.is_set():
                raise ClientGone
            await event.wait()
        if conn.gone.is_set() or seq.state != "finished":
            raise ClientGone
        s = self.shapes
        out: JsonObj = {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": filler_text(seq.generated, fault.accented)}],
            "model": model,
            "stop_reason": _STOP.get(seq.finish_reason or "length", "end_turn"),
        }
        if s.body_stop_sequence:
            out["stop_sequence"] = None
        out["usage"] = _usage(s.body_usage, seq.prompt_tokens, seq.cached_tokens, seq.generated)
        await self.api.send_json(conn, fault, 200, out)

    async def _stream(
        self, conn: HttpConn, fault: Fault, seq: SimSequence, event: asyncio.Event, message_id: str, model: Any
    ) -> None:
        api, s = self.api, self.shapes
        headers = [
            ("content-type", api.flavour.sse_type),
            ("cache-control", "no-cache"),
            ("transfer-encoding", "chunked"),
        ]
        await conn.send_head(200, api.common_headers(conn, fault) + headers)
        sent = 0
        while True:
            event.clear()
            while sent < seq.generated:
                await conn.sleep(fault.first_token_delay if sent == 0 else fault.chunk_delay)
                if sent == 0:
                    start: JsonObj = {"id": message_id, "type": "message", "role": "assistant", "content": []}
                    start["model"] = model
                    if s.start_stop_fields:
                        start |= {"stop_reason": None, "stop_sequence": None}
                    start["usage"] = _usage(s.start_usage, seq.prompt_tokens, seq.cached_tokens, 0)
                    await _event(conn, "message_start", {"type": "message_start", "message": start})
                    block = {"type": "text", "text": ""}
                    await _event(
                        conn, "content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}
                    )
                delta = {"type": "text_delta", "text": filler_token(sent, fault.accented)}
                await _event(conn, "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
                sent += 1
            if seq.state == "finished" and sent >= seq.generated:
                break
            if conn.gone.is_set() or seq.state == "aborted":
                raise ClientGone
            await event.wait()
        await _event(conn, "content_block_stop", {"type": "content_block_stop", "index": 0})
        stop: JsonObj = {"stop_reason": _STOP.get(seq.finish_reason or "length", "end_turn")}
        if s.delta_stop_sequence:
            stop["stop_sequence"] = None
        usage = _usage(s.delta_usage, seq.prompt_tokens, seq.cached_tokens, seq.generated)
        await _event(conn, "message_delta", {"type": "message_delta", "delta": stop, "usage": usage})
        await _event(conn, "message_stop", {"type": "message_stop"})
        await conn.send_chunk(b"")


async def _event(conn: HttpConn, name: str, data: JsonObj) -> None:
    await conn.send_chunk(b"event: " + name.encode() + b"\ndata: " + dumps(data) + b"\n\n")


def _message(error: JsonObj) -> str:
    """The message of a flavour's error body (OpenAI's nested shape, or SGLang's flat one)."""
    inner = error.get("error")
    return str(inner.get("message") if isinstance(inner, dict) else error.get("message", ""))
