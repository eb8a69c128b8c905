"""A Responses request's tools as chat completions functions, and the way back. Pure: no I/O.

Chat completions has one kind of tool, a function with a flat name. Codex CLI also sends
`namespace` tools (every MCP server is one: functions grouped under a name), freeform `custom`
tools (apply_patch, a grammar instead of a JSON schema) and hosted tools that run at OpenAI
(web_search, tool_search, image_generation). So, per request:
- a namespace's functions become functions named `<namespace>__<name>` (legal chat names, at most 64
  characters; a clash or an over-long name gets a short hash), restored to `name` + `namespace` in the
  output items, the stream's events and the history the client sends back;
- a custom tool becomes a function with one string parameter, `input`, and its calls come back as
  `custom_tool_call` items with that string as `input` (Codex rejects a function_call for them);
- a hosted tool is dropped and named in x-gateway-dropped."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from gateway.protocols.dropped import Dropped

_LEGAL = re.compile(r"[^A-Za-z0-9_-]")
_MAX_NAME = 64
_CUSTOM_PARAMETERS = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The tool's input, as free text."}},
    "required": ["input"],
}


class ToolNames:
    """The per-request map between the chat function names and the client's tools."""

    __slots__ = ("custom", "flat", "origin")

    def __init__(self) -> None:
        self.flat: dict[tuple[str, str], str] = {}
        """(namespace, name) -> the chat name; namespace "" for a top-level tool."""
        self.origin: dict[str, tuple[str, str]] = {}
        """The chat name -> (namespace, name)."""
        self.custom: set[str] = set()
        """Chat names of custom (freeform) tools."""

    def name_for(self, namespace: str, name: str) -> str:
        """The chat name of a tool (made once; a history item for a tool not offered gets one too)."""
        key = (namespace, name)
        known = self.flat.get(key)
        if known is not None:
            return known
        flat = _LEGAL.sub("_", f"{namespace}__{name}" if namespace else name)
        if len(flat) > _MAX_NAME or flat in self.origin or (not namespace and flat != name):
            digest = hashlib.blake2b(f"{namespace}\x00{name}".encode(), digest_size=4).hexdigest()
            flat = f"{flat[: _MAX_NAME - 9]}_{digest}"
        self.flat[key] = flat
        self.origin[flat] = key
        return flat

    def restore(self, flat: str) -> tuple[str, str, bool]:
        """(namespace, name, custom) of a chat name the model called; an unknown name as it is."""
        namespace, name = self.origin.get(flat, ("", flat))
        return namespace, name, flat in self.custom

    @property
    def renames(self) -> bool:
        return bool(self.custom) or any(flat != name for flat, (_, name) in self.origin.items())


def chat_tools(tools: Any, names: ToolNames, lost: Dropped) -> list[dict[str, Any]]:
    """The chat functions for a Responses `tools` array."""
    out: list[dict[str, Any]] = []
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, dict):
            continue
        kind = tool.get("type")
        if kind == "function" and isinstance(tool.get("name"), str):
            out.append(_function(tool, names.name_for("", tool["name"])))
        elif kind == "namespace" and isinstance(tool.get("name"), str):
            for inner in tool.get("tools") or ():
                if isinstance(inner, dict) and isinstance(inner.get("name"), str):
                    if inner.get("type", "function") == "function":
                        out.append(_function(inner, names.name_for(tool["name"], inner["name"])))
                    else:
                        lost.add(str(inner.get("type")))
        elif kind == "custom" and isinstance(tool.get("name"), str):
            flat = names.name_for("", tool["name"])
            names.custom.add(flat)
            function: dict[str, Any] = {"name": flat, "parameters": _CUSTOM_PARAMETERS}
            description = tool.get("description")
            if isinstance(description, str):
                function["description"] = description
            fmt = tool.get("format")
            if isinstance(fmt, dict) and isinstance(fmt.get("definition"), str):
                # The grammar the input must follow, where the model can read it.
                function["description"] = f"{function.get('description', '')}\n\nInput format:\n{fmt['definition']}"
            out.append({"type": "function", "function": function})
        else:
            lost.add(str(kind) if isinstance(kind, str) else "tool")
    return out


def _function(tool: Mapping[str, Any], name: str) -> dict[str, Any]:
    parameters = tool.get("parameters")
    function: dict[str, Any] = {
        "name": name,
        "parameters": parameters if isinstance(parameters, dict) else {"type": "object"},
    }
    for key in ("description", "strict"):
        if tool.get(key) is not None:
            function[key] = tool[key]
    return {"type": "function", "function": function}


def chat_tool_choice(choice: Any, names: ToolNames) -> Any:
    """A Responses tool_choice for chat: a named function or custom tool by its chat name; anything
    chat cannot say (allowed_tools, a hosted tool) as "auto"."""
    if choice in ("auto", "none", "required"):
        return choice
    if (
        isinstance(choice, dict)
        and choice.get("type") in ("function", "custom")
        and isinstance(choice.get("name"), str)
    ):
        namespace = choice.get("namespace")
        flat = names.name_for(namespace if isinstance(namespace, str) else "", choice["name"])
        return {"type": "function", "function": {"name": flat}}
    return "auto"


def custom_input(arguments: str) -> str:
    """A custom tool's free-text input from the chat call's JSON arguments ({"input": "..."}); the
    arguments themselves when the model wrote something else."""
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get("input"), str):
        return str(value["input"])
    return arguments


def call_item(
    names: ToolNames | None, item_id: str, call_id: str, flat: str, arguments: str, status: str = "completed"
) -> dict[str, Any]:
    """The output item of a chat tool call: a function_call (with its namespace) or a custom_tool_call."""
    namespace, name, custom = names.restore(flat) if names is not None else ("", flat, False)
    if custom:
        return {
            "type": "custom_tool_call",
            "id": item_id,
            "call_id": call_id,
            "name": name,
            "input": custom_input(arguments) if status == "completed" else "",
            "status": status,
        }
    item: dict[str, Any] = {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }
    if namespace:
        item["namespace"] = namespace
    return item
