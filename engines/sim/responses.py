"""The simulator's OpenAI Responses API, for the flavours whose real engine serves it (vLLM, SGLang):
POST /v1/responses (a body, or the event stream), GET /v1/responses/{id}, POST .../cancel, and
previous_response_id. Every answer is stored (as vLLM with VLLM_ENABLE_RESPONSES_API_STORE=1, and
SGLang with --enable-response-store), up to a bound; shapes follow tests/fixtures/{vllm/protocols,sglang/proto_*}."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict

from engines.sim.api import Killed, SimApi, dumps
from engines.sim.cache import block_hashes
from engines.sim.faults import Fault
from engines.sim.flavours import JsonObj
from engines.sim.http import ClientGone, HttpConn, HttpRequest
from engines.sim.model import SimSequence
from engines.sim.text import filler_text, filler_token, message_text, render_chat, tokenize

MAX_STORED = 10_000


class ResponseStore:
    """Stored responses (and the conversation each continues), oldest dropped past MAX_STORED."""

    def __init__(self) -> None:
        self.responses: OrderedDict[str, JsonObj] = OrderedDict()
        self.history: dict[str, list[JsonObj]] = {}

    def put(self, response: JsonObj, history: list[JsonObj]) -> None:
        self.responses[response["id"]] = response
        self.history[response["id"]] = history
        while len(self.responses) > MAX_STORED:
            old, _ = self.responses.popitem(last=False)
            self.history.pop(old, None)


def _not_found(api: SimApi, response_id: str) -> tuple[int, JsonObj]:
    message = f"Response with id '{response_id}' not found."
    if api.params.flavour == "vllm":
        return 404, {
            "error": {"message": message, "type": "invalid_request_error", "param": "response_id", "code": 404}
        }
    return 404, api.flavour.error(404, message)


def _messages(body: JsonObj, history: list[JsonObj]) -> list[JsonObj]:
    out = list(history)
    if isinstance(body.get("instructions"), str) and not history:
        out.append({"role": "system", "content": body["instructions"]})
    given = body.get("input")
    if isinstance(given, str):
        out.append({"role": "user", "content": given})
        return out
    if not isinstance(given, list) or not given:
        raise ValueError("'input' must be a string or a non-empty list")
    for item in given:
        if not isinstance(item, dict):
            raise ValueError("each input item must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            content = item.get("content")
            text = (
                message_text(content)
                if not isinstance(content, list)
                else "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            )
            out.append({"role": str(item.get("role", "user")), "content": text})
        elif kind == "function_call_output":
            out.append({"role": "tool", "content": str(item.get("output", ""))})
        elif kind == "function_call":
            out.append({"role": "assistant", "content": str(item.get("arguments", ""))})
    return out


def _usage(api: SimApi, prompt: int, cached: int, output: int) -> JsonObj:
    if api.params.flavour == "vllm":
        return {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0, "input_tokens_per_turn": [],
                                     "cached_tokens_per_turn": []},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0, "output_tokens_per_turn": [],
                                      "tool_output_tokens_per_turn": []},
            "total_tokens": prompt + output,
        }  # fmt: skip
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + output,
    }


def _object(api: SimApi, rid: str, body: JsonObj, created: int) -> JsonObj:
    """The response object in progress, with the flavour's keys."""
    common = {
        "id": rid,
        "created_at": created,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "metadata": body.get("metadata"),
        "model": body.get("model") or api.params.model,
        "object": "response",
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": body.get("tool_choice", "none" if api.params.flavour == "vllm" else "auto"),
        "tools": body.get("tools") or [],
        "max_output_tokens": body.get("max_output_tokens"),
        "previous_response_id": body.get("previous_response_id"),
        "status": "in_progress",
        "text": None,
        "truncation": "disabled",
        "usage": None,
        "user": None,
    }
    if api.params.flavour == "vllm":
        return common | {
            "temperature": 1.0, "top_p": 1.0, "background": False, "max_tool_calls": None, "prompt": None,
            "reasoning": None, "service_tier": "auto", "top_logprobs": None, "presence_penalty": 0.0,
            "frequency_penalty": 0.0, "kv_transfer_params": None, "ec_transfer_params": None,
            "input_messages": None, "output_messages": None,
        }  # fmt: skip
    return common | {
        "error": None,
        "reasoning": {"effort": None, "summary": None},
        "store": True,
        "temperature": None,
        "top_p": None,
        "metadata": body.get("metadata") or {},
    }


def _message(api: SimApi, item_id: str, text: str, status: str) -> JsonObj:
    phase = None if api.params.flavour == "vllm" else "final_answer"
    part: JsonObj = {"annotations": [], "text": text, "type": "output_text", "logprobs": None}
    content = [part] if status != "new" else []
    return {"id": item_id, "content": content, "role": "assistant",
            "status": "in_progress" if status == "new" else "completed", "type": "message", "phase": phase}  # fmt: skip


def _part(text: str, logprobs: list[object] | None) -> JsonObj:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


def _finish(api: SimApi, obj: JsonObj, item_id: str, seq: SimSequence, text: str) -> JsonObj:
    cut = seq.finish_reason == "length"
    if api.params.flavour == "sglang":  # SGLang fills in the text format only in the finished object
        obj = obj | {"text": {"format": {"type": "text"}}}
    return obj | {
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "output": [_message(api, item_id, text, "done")],
        "usage": _usage(api, seq.prompt_tokens, seq.cached_tokens, seq.generated),
    }


async def create(api: SimApi, store: ResponseStore, conn: HttpConn, req: HttpRequest, fault: Fault) -> None:
    body = api.parse_body(req)
    if isinstance(body, tuple):
        await api.send_json(conn, fault, *body)
        return
    if (not_found := api.flavour.unknown_model(body.get("model"))) is not None:
        await api.send_json(conn, fault, *not_found)
        return
    previous = body.get("previous_response_id")
    history: list[JsonObj] = []
    if previous is not None:
        if previous not in store.history:
            await api.send_json(conn, fault, *_not_found(api, str(previous)))
            return
        history = store.history[previous]
    try:
        messages = _messages(body, history)
        ids = tokenize(render_chat(messages, True, body.get("tools")))
    except ValueError as exc:
        await api.send_error(conn, fault, 400, str(exc))
        return
    wanted = body.get("max_output_tokens")
    if wanted is not None and (type(wanted) is not int or wanted < 1):
        await api.send_error(conn, fault, 400, "'max_output_tokens' must be an integer >= 1")
        return
    max_tokens, too_long = api.flavour.check_length(len(ids), wanted)
    if too_long is not None:
        await api.send_json(conn, fault, *too_long)
        return
    seq = SimSequence(len(ids), max_tokens, block_hashes(ids, api.params.block_size), stop_after=fault.tokens)
    rid, item_id = "resp_" + uuid.uuid4().hex, "msg_" + uuid.uuid4().hex
    obj = _object(api, rid, body, int(time.time()))
    event = api.engine.submit(seq)
    conn.wake_on_gone(event)
    try:
        if body.get("stream") is True:
            final = await _stream(api, conn, fault, obj, item_id, seq, event)
        else:
            final = await _whole(api, conn, fault, obj, item_id, seq, event)
        store.put(final, [*messages, {"role": "assistant", "content": final["output"][0]["content"][0]["text"]}])
    finally:
        api.engine.abort(seq)


async def _whole(
    api: SimApi, conn: HttpConn, fault: Fault, obj: JsonObj, item_id: str, seq: SimSequence, event: asyncio.Event
) -> JsonObj:
    while seq.state in ("waiting", "running"):
        event.clear()
        if conn.gone.is_set():
            raise ClientGone
        await event.wait()
    if conn.gone.is_set() or seq.state != "finished":
        raise ClientGone
    final = _finish(api, obj, item_id, seq, filler_text(seq.generated, fault.accented))
    await api.send_json(conn, fault, 200, final)
    return final


async def _stream(
    api: SimApi, conn: HttpConn, fault: Fault, obj: JsonObj, item_id: str, seq: SimSequence, event: asyncio.Event
) -> JsonObj:
    headers = [("content-type", api.flavour.sse_type), ("cache-control", "no-cache"), ("transfer-encoding", "chunked")]
    await conn.send_head(200, api.common_headers(conn, fault) + headers)
    number = 0

    async def emit(name: str, fields: JsonObj) -> None:
        nonlocal number
        data = {**fields, "sequence_number": number, "type": name}
        number += 1
        await conn.send_chunk(b"event: " + name.encode() + b"\ndata: " + dumps(data) + b"\n\n")

    where: JsonObj = {"content_index": 0, "item_id": item_id, "output_index": 0}
    await emit("response.created", {"response": obj})
    await emit("response.in_progress", {"response": obj})
    sent, text = 0, ""
    while True:
        event.clear()
        while sent < seq.generated:
            if fault.die_after is not None and sent >= fault.die_after:
                await conn.kill(fault.die == "rst")
                raise Killed
            await conn.sleep(fault.first_token_delay if sent == 0 else fault.chunk_delay)
            if sent == 0:
                await emit("response.output_item.added", {"item": _message(api, item_id, "", "new"), "output_index": 0})
                await emit("response.content_part.added", {**where, "part": _part("", [])})
            token = filler_token(sent, fault.accented)
            text += token
            await emit("response.output_text.delta", {**where, "delta": token, "logprobs": []})
            sent += 1
        if seq.state == "finished" and sent >= seq.generated:
            break
        if conn.gone.is_set() or seq.state == "aborted":
            raise ClientGone
        await event.wait()
    await emit("response.output_text.done", {**where, "logprobs": [], "text": text})
    await emit("response.content_part.done", {**where, "part": _part(text, None)})
    await emit("response.output_item.done", {"item": _message(api, item_id, text, "done"), "output_index": 0})
    final = _finish(api, obj, item_id, seq, text)
    # SGLang ends a cut answer with response.incomplete, as OpenAI does; vLLM says response.completed.
    cut = api.params.flavour == "sglang" and final["status"] == "incomplete"
    await emit("response.incomplete" if cut else "response.completed", {"response": final})
    await conn.send_chunk(b"")
    return final


async def retrieve(api: SimApi, store: ResponseStore, conn: HttpConn, req: HttpRequest, fault: Fault) -> None:
    response_id = req.path.removeprefix("/v1/responses/")
    found = store.responses.get(response_id)
    if found is None:
        await api.send_json(conn, fault, *_not_found(api, response_id))
        return
    await api.send_json(conn, fault, 200, found)


async def cancel(api: SimApi, store: ResponseStore, conn: HttpConn, req: HttpRequest, fault: Fault) -> None:
    response_id = req.path.removeprefix("/v1/responses/").removesuffix("/cancel")
    if response_id not in store.responses:
        await api.send_json(conn, fault, *_not_found(api, response_id))
        return
    # Every simulated response is synchronous and finished by the time its id is known (vLLM's answer).
    await api.send_error(conn, fault, 400, "Cannot cancel a synchronous response.")
