"""The simulator's /v1/chat/completions and /v1/completions: validate, run through the batching engine,
answer as one JSON body or as SSE (one token per event), honouring the per-chunk fault knobs."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any

from engines.sim.api import Killed, SimApi, dumps
from engines.sim.cache import block_hashes
from engines.sim.faults import Fault
from engines.sim.flavours import Gen, JsonObj, Reply
from engines.sim.http import ClientGone, HttpConn, HttpRequest
from engines.sim.model import SimSequence
from engines.sim.text import filler_text, filler_token, render_chat, tokenize

_GARBAGE = b'this line has no data field\n\ndata: {"choices": [{"delta": \n\n'


@dataclass
class _Parsed:
    prompt_ids: list[int]
    max_tokens: int | None
    stream: bool
    include_usage: bool
    model: str


def _parse(api: SimApi, body: JsonObj, chat: bool) -> _Parsed | Reply:
    """The request's essentials, or an error reply."""
    if chat and "messages" not in body:
        return api.flavour.missing("messages", body)
    n = body.get("n", 1)
    if n != 1:
        return 400, api.flavour.error(400, "the simulator supports only n=1")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        return 400, api.flavour.error(400, "'stream' must be a boolean")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if api.params.flavour == "llamacpp" and body.get("n_predict") is not None:
        max_tokens = body["n_predict"]  # llama-server's own field wins over max_tokens, as there
    if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
        return 400, api.flavour.error(400, "'max_tokens' must be an integer >= 1")
    try:
        if chat:
            messages = body["messages"]
            if not isinstance(messages, list) or not messages:
                raise ValueError("'messages' must be a non-empty list")
            ids = tokenize(render_chat(messages, True, body.get("tools")))
        else:
            ids = _prompt_ids(body.get("prompt"))
    except ValueError as exc:
        return 400, api.flavour.error(400, str(exc))
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    model = body.get("model")
    return _Parsed(ids, max_tokens, stream, include_usage, model if isinstance(model, str) else api.params.model)


def _prompt_ids(prompt: Any) -> list[int]:
    # One prompt only: a string, token ids, or a one-element batch of either.
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenize(prompt)
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return list(prompt)
    raise ValueError("'prompt' must be a string or a list of token ids (batches are not supported)")


async def completion(api: SimApi, conn: HttpConn, req: HttpRequest, fault: Fault, chat: bool) -> None:
    body = api.parse_body(req)
    if isinstance(body, tuple):
        await api.send_json(conn, fault, *body)
        return
    if (not_found := api.flavour.unknown_model(body.get("model"))) is not None:
        await api.send_json(conn, fault, *not_found)
        return
    parsed = _parse(api, body, chat)
    if isinstance(parsed, tuple):
        await api.send_json(conn, fault, *parsed)
        return
    prompt = len(parsed.prompt_ids)
    max_tokens, too_long = api.flavour.check_length(prompt, parsed.max_tokens)
    if too_long is not None:
        await api.send_json(conn, fault, *too_long)
        return
    seq = SimSequence(
        prompt_tokens=prompt,
        max_tokens=max_tokens,
        stop_after=fault.tokens,
        hashes=block_hashes(parsed.prompt_ids, api.params.block_size),
    )
    prefix = "chatcmpl-" if chat else api.flavour.completion_id_prefix
    g = Gen(
        id=prefix + uuid.uuid4().hex,
        chat=chat,
        model=parsed.model,
        include_usage=parsed.include_usage,
        prompt_tokens=prompt,
    )
    event = api.engine.submit(seq)
    conn.wake_on_gone(event)
    try:
        if parsed.stream:
            await _stream(api, conn, fault, g, seq, event)
        else:
            await _whole(api, conn, fault, g, seq, event)
    finally:
        api.engine.abort(seq)  # a no-op once finished; stops the work at once when the client left


async def _whole(api: SimApi, conn: HttpConn, fault: Fault, g: Gen, seq: SimSequence, event: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    first = start
    while seq.state in ("waiting", "running"):
        event.clear()
        if conn.gone.is_set():
            raise ClientGone
        if seq.generated and first == start:
            first = loop.time()
        await event.wait()
    if conn.gone.is_set() or seq.state != "finished":
        raise ClientGone
    await conn.sleep(fault.first_token_delay)
    g.cached_tokens, g.completion_tokens = seq.cached_tokens, seq.generated
    g.prompt_s, g.decode_s = first - start, loop.time() - first
    text = filler_text(seq.generated, fault.accented)
    await api.send_json(conn, fault, 200, api.flavour.response(g, text, seq.finish_reason or "length"))


async def _stream(api: SimApi, conn: HttpConn, fault: Fault, g: Gen, seq: SimSequence, event: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    first = start
    headers = [
        ("content-type", api.flavour.sse_type),
        ("cache-control", "no-cache"),
        ("transfer-encoding", "chunked"),
    ]
    await conn.send_head(200, api.common_headers(conn, fault) + headers)
    if fault.empty_stream:
        await conn.send_chunk(b"")
        return
    if fault.first_event_error:
        await _event(conn, dumps(api.flavour.error(500, "simulated error in the first event")))
        await _event(conn, b"[DONE]")
        await conn.send_chunk(b"")
        return
    sent = 0
    while True:
        event.clear()
        while sent < seq.generated:
            await _before_chunk(conn, fault, sent, delay=True)
            if sent == 0:
                first = loop.time()
                for opening in api.flavour.open_events(g):
                    await _event(conn, dumps(opening))
                if fault.garbage:
                    await conn.send_chunk(_GARBAGE)
            last = seq.state == "finished" and sent + 1 == seq.generated
            finish = seq.finish_reason if last and api.flavour.finish_on_last_token else None
            text = "x" * fault.huge_event if sent == 0 and fault.huge_event else filler_token(sent, fault.accented)
            await _event(conn, dumps(api.flavour.token_event(g, text, finish)))
            sent += 1
        if seq.state == "finished" and sent >= seq.generated:
            break
        if conn.gone.is_set() or seq.state == "aborted":
            raise ClientGone
        await event.wait()
    await _before_chunk(conn, fault, sent, delay=False)
    g.cached_tokens, g.completion_tokens = seq.cached_tokens, seq.generated
    g.prompt_s, g.decode_s = first - start, loop.time() - first
    for closing in api.flavour.close_events(g, seq.finish_reason or "length"):
        await _event(conn, dumps(closing))
    await _event(conn, b"[DONE]")
    await conn.send_chunk(b"")


async def _before_chunk(conn: HttpConn, fault: Fault, sent: int, delay: bool) -> None:
    """Apply the stall/die/delay knobs before content chunk number ``sent`` (or before the end)."""
    if fault.stall_after is not None and sent >= fault.stall_after:
        await conn.gone.wait()
        raise ClientGone
    if fault.die_after is not None and sent >= fault.die_after:
        await conn.kill(fault.die == "rst")
        raise Killed
    if delay:
        await conn.sleep(fault.first_token_delay if sent == 0 else fault.chunk_delay)


async def _event(conn: HttpConn, data: bytes) -> None:
    await conn.send_chunk(b"data: " + data + b"\n\n")
