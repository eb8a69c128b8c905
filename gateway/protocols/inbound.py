"""Parse an OpenAI-shaped request body once: bounded size and depth, strict types, and the few fields
the gateway needs (model, stream, messages, max_tokens, session), into a frozen Inbound. Pure: no I/O."""

from __future__ import annotations

import json
import math
import re
from typing import Any, Literal

from gateway.errors import InvalidRequest
from gateway.protocols.base import Inbound

Kind = Literal["chat", "completions", "embeddings"]

# Fields a client might use to steer the upstream URL or credentials (LiteLLM #37053). The backend
# URL and key always come from config, so these are dropped before forwarding.
# Output-length fields some engine honours besides `max_tokens` (docs/reliability.md defect 6; ENGINES.md):
# OpenAI's and vLLM's `max_completion_tokens`, llama.cpp's `n_predict`, the `max_new_tokens` of SGLang,
# LMDeploy and TGI, Ollama's `num_predict`. The largest one present is what the caps see, and a clamp
# writes every one of them, so no engine's field can carry more than the limit.
LENGTH_FIELDS = ("max_tokens", "max_completion_tokens", "n_predict", "max_new_tokens", "num_predict")
_UNBOUNDED = (-1, -2)
"""llama.cpp's and Ollama's "no limit" (-1) and "until the context is full" (-2): no number asked for."""
STEERING_FIELDS = ("api_base", "base_url", "api_key", "api_version", "custom_llm_provider", "organization")
_MAX_MODEL_CHARS = 256
_MAX_INT = 2**31 - 1


def _depth_ok(value: Any, limit: int) -> bool:
    """Iterative, so a hostile 10,000-deep body cannot raise RecursionError here."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return False
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values() if isinstance(v, dict | list))
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node if isinstance(v, dict | list))
    return True


# A JSON string, escapes included (the unrolled form: linear, no backtracking).
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


def check_json_size(raw: bytes, max_nodes: int, max_containers: int) -> None:
    """Refuse, before parsing, a body whose JSON would be too many Python objects: 3.4 million
    `{}` fit in 10 MiB and cost 500 MB to parse. Counts `{`, `[` (containers) and `,` (one per
    further value). A body shorter than both limits cannot exceed them and is not scanned; the
    first count includes characters inside strings (one C pass, ~0.4 ms a MiB), and only a body
    over a limit is counted again with its strings removed (code in a prompt is not JSON)."""
    if len(raw) <= min(max_nodes, max_containers):
        return
    nodes, containers = _structure_counts(raw, max_containers)
    if containers <= max_containers and nodes <= max_nodes:
        return
    nodes, containers = _structure_counts(_JSON_STRING.sub(b"", raw), max_containers)
    if containers > max_containers:
        raise InvalidRequest(
            f"The JSON body has too many objects and arrays (over {max_containers}).", code="json_too_many_nodes"
        )
    if nodes > max_nodes:
        raise InvalidRequest(f"The JSON body has too many values (over {max_nodes}).", code="json_too_many_nodes")


def _structure_counts(raw: bytes, max_containers: int) -> tuple[int, int]:
    """(`{`, `[` and `,` together; `{` and `[`) in raw; bytes.translate is one pass in C, and the
    second pass is skipped when the first already bounds both."""
    size = len(raw)
    nodes = size - len(raw.translate(None, b"{[,"))
    return nodes, (size - len(raw.translate(None, b"{[")) if nodes > max_containers else nodes)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
"""Built once: json.loads with any keyword builds a new decoder (and its C scanner) per call."""


def decode_json(
    raw: bytes, max_depth: int, max_nodes: int = 1_000_000, max_containers: int = 100_000
) -> dict[str, Any]:
    if not raw.strip():
        raise InvalidRequest("The request body is empty; send a JSON object.", code="invalid_json")
    check_json_size(raw, max_nodes, max_containers)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequest("The request body is not valid UTF-8.", code="invalid_json") from None
    try:
        if text.startswith("\ufeff"):  # what json.loads refuses before decoding
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        value = _DECODER.decode(text)
    except RecursionError:
        raise InvalidRequest(f"The JSON body is nested too deeply (limit {max_depth}).", code="json_too_deep") from None
    except ValueError as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(value, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_json")
    # Nesting needs a `{` or `[` per level: a body with no more of them than the limit is not walked.
    if len(raw) - len(raw.translate(None, b"{[")) > max_depth and not _depth_ok(value, max_depth):
        raise InvalidRequest(f"The JSON body is nested too deeply (limit {max_depth}).", code="json_too_deep")
    if (b"\\ud" in raw or b"\\uD" in raw) and _has_lone_surrogate(value):
        raise InvalidRequest("The request body contains an unpaired UTF-16 surrogate.", code="invalid_json")
    return value


def _has_lone_surrogate(value: Any) -> bool:
    # json.loads turns "\ud800" escapes into lone surrogates, which cannot be re-encoded as UTF-8.
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def positive_int(body: dict[str, Any], field: str) -> int | None:
    """A positive integer field, or None when absent; InvalidRequest naming the field otherwise."""
    return _positive_int(body, field)


def check_model(body: dict[str, Any]) -> str:
    """The body's model name; InvalidRequest when it is missing, too long or not printable."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a string.", param="model", code="invalid_type")
    if len(model) > _MAX_MODEL_CHARS or not model.isprintable():
        raise InvalidRequest("'model' is too long or contains control characters.", param="model", code="invalid_value")
    return model


def _length_limit(body: dict[str, Any]) -> tuple[int | None, tuple[str, ...]]:
    """The largest output length asked for in any engine's field, and the fields present."""
    present = tuple(name for name in LENGTH_FIELDS if body.get(name) is not None)
    largest: int | None = None
    for name in present:
        if name in ("n_predict", "num_predict") and body[name] in _UNBOUNDED and type(body[name]) is int:
            continue
        value = _positive_int(body, name)
        if value is not None and (largest is None or value > largest):
            largest = value
    return largest, present


def _positive_int(body: dict[str, Any], field: str) -> int | None:
    value = body.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer() and math.isfinite(value):
            value = int(value)
        else:
            raise InvalidRequest(f"'{field}' must be a positive integer.", param=field, code="invalid_value")
    if value <= 0:
        raise InvalidRequest(f"'{field}' must be a positive integer, got {value}.", param=field, code="invalid_value")
    if value > _MAX_INT:
        raise InvalidRequest(f"'{field}' is too large ({value}).", param=field, code="invalid_value")
    return int(value)


def _check_number(body: dict[str, Any], field: str) -> None:
    value = body.get(field)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise InvalidRequest(f"'{field}' must be a number.", param=field, code="invalid_type")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidRequest(f"'{field}' must be a finite number.", param=field, code="invalid_value")


def _check_messages(messages: Any, max_messages: int) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty array.", param="messages", code="invalid_type")
    if len(messages) > max_messages:
        raise InvalidRequest(
            f"Too many messages ({len(messages)} > {max_messages}).", param="messages", code="too_many_messages"
        )
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequest(f"'messages[{i}]' must be an object.", param=f"messages[{i}]", code="invalid_type")
        role = message.get("role")
        if not isinstance(role, str):
            raise InvalidRequest(
                f"'messages[{i}].role' must be a string.", param=f"messages[{i}].role", code="invalid_type"
            )
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise InvalidRequest(
                f"'messages[{i}].content' must be a string or an array of parts.",
                param=f"messages[{i}].content",
                code="invalid_type",
            )
    return messages


def parse_request(
    kind: Kind,
    raw: bytes,
    *,
    max_depth: int,
    max_n: int,
    max_messages: int,
    max_nodes: int = 1_000_000,
    max_containers: int = 100_000,
) -> Inbound:
    body = decode_json(raw, max_depth, max_nodes, max_containers)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a string.", param="model", code="invalid_type")
    if len(model) > _MAX_MODEL_CHARS or not model.isprintable():
        raise InvalidRequest("'model' is too long or contains control characters.", param="model", code="invalid_value")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be a boolean.", param="stream", code="invalid_type")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object.", param="stream_options", code="invalid_type")
    include_usage = bool(options and options.get("include_usage") is True)
    for field in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        _check_number(body, field)
    n = _positive_int(body, "n") or 1
    if n > max_n:
        raise InvalidRequest(f"'n' must be at most {max_n}.", param="n", code="invalid_value")
    best_of = _positive_int(body, "best_of")
    if best_of is not None and best_of > max_n:
        raise InvalidRequest(f"'best_of' must be at most {max_n}.", param="best_of", code="invalid_value")
    field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens, length_fields = _length_limit(body)
    messages = None
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise InvalidRequest("'tools' must be an array.", param="tools", code="invalid_type")
    if kind == "chat":
        messages = _check_messages(body.get("messages"), max_messages)
    elif kind == "completions":
        prompt = body.get("prompt")
        if not isinstance(prompt, str | list) or (isinstance(prompt, list) and not prompt):
            raise InvalidRequest("'prompt' must be a string or a non-empty array.", param="prompt", code="invalid_type")
    else:
        if body.get("input") is None:
            raise InvalidRequest("'input' is required.", param="input", code="invalid_type")
        if stream:
            raise InvalidRequest("Embeddings cannot be streamed.", param="stream", code="invalid_value")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise InvalidRequest("'user' must be a string.", param="user", code="invalid_type")
    return Inbound(
        api=kind,
        raw=raw,
        body=body,
        model=model,
        stream=stream,
        include_usage=include_usage,
        max_tokens=max_tokens,
        max_tokens_field=None if kind == "embeddings" else field,
        length_fields=() if kind == "embeddings" else length_fields,
        n=n,
        messages=messages,
        has_tools=bool(tools),
        user=user,
        stripped=tuple(name for name in STEERING_FIELDS if name in body),
    )
