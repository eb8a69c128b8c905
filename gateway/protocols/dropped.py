"""What a translation to chat completions could not express: collected by name while a request is
translated, said in the x-gateway-dropped response header and counted in
gateway_dropped_features_total (docs/agents.md lists each name). Pure: a leaf."""

from __future__ import annotations

MESSAGES_FIELDS = (
    "thinking",
    "context_management",
    "output_config",
    "service_tier",
    "container",
    "mcp_servers",
    "inference_geo",
)
"""Top-level Messages fields with no chat equivalent (metadata's user_id becomes chat's `user`; the
rest steer Anthropic's own service)."""

KNOWN_DROPPED = frozenset(
    {
        *MESSAGES_FIELDS,
        # Messages
        "cache_control",
        "defer_loading",
        "eager_input_streaming",
        "input_examples",
        "allowed_callers",
        "strict",
        "image",
        "document",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "search_result",
        "container_upload",
        "tool_without_schema",
        "web_search_20250305",
        "web_fetch_20250910",
        "code_execution_20250825",
        # Responses
        "web_search",
        "web_search_preview",
        "file_search",
        "tool_search",
        "image_generation",
        "code_interpreter",
        "computer_use_preview",
        "local_shell",
        "mcp",
        "reasoning",
        "reasoning.encrypted_content",
        "include",
        "store",
        "prompt_cache_key",
        "client_metadata",
        "compaction",
        "truncation",
        "metadata",
        "prompt",
        "background",
        "conversation",
        "max_tool_calls",
        "top_logprobs",
        "safety_identifier",
        "input_file",
        "input_audio",
    }
)
"""The names the translators emit; any other (a client's own tool type) is counted as "other"."""


class Dropped:
    """The features a translation left out, by name, in the order first met."""

    __slots__ = ("names",)

    def __init__(self) -> None:
        self.names: list[str] = []

    def add(self, name: str) -> None:
        if name not in self.names:
            self.names.append(name)
