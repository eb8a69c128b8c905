"""A route's section of gateway.yaml: the model it serves, its pools, rules, caps and aliases."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import Field, field_validator

from gateway.config.schema import Priority, Section


class RuleWhen(Section):
    shared_prefix: bool | None = None
    platform: Literal["mac", "no_nvidia_gpu", "nvidia_gpu"] | None = None
    header: Mapping[str, str] | None = None
    model: str | None = None
    min_prompt_tokens: Annotated[int, Field(ge=0)] | None = None
    max_prompt_tokens: Annotated[int, Field(ge=0)] | None = None
    has_tools: bool | None = None
    stream: bool | None = None


class RuleConfig(Section):
    name: str | None = None
    when: RuleWhen = RuleWhen()
    pool: str


class CapsConfig(Section):
    max_context_tokens: Annotated[int, Field(ge=16)] | None = None
    on_exceed: Literal["reject", "truncate_oldest"] = "reject"
    default_max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_tokens_limit: Annotated[int, Field(ge=1)] | None = None
    exact_margin: Annotated[float, Field(ge=0, le=1)] = 0.15
    """Within this fraction of the cap, count tokens exactly with the engine instead of estimating."""


class RouteConfig(Section):
    model: Annotated[str, Field(min_length=1)]
    """Client-facing model name, or a glob such as `llama-*`."""
    name: str | None = None
    upstream_model: str | None = None
    pools: Annotated[tuple[str, ...], Field(min_length=1)]
    rules: tuple[RuleConfig, ...] = ()
    caps: CapsConfig = CapsConfig()
    priority: Priority | None = None
    """The class of this route's requests for keys that set none (the lower of the two when both do)."""
    reasoning_content: Literal["off", "copy"] = "off"
    """On chat completions: `copy` sets `reasoning_content` from `reasoning` (vLLM 0.32 sends only the
    latter; many clients read the former) in answers and stream chunks; `off` relays the bytes as sent."""

    @field_validator("reasoning_content", mode="before")
    @classmethod
    def _yaml_off(cls, value: object) -> object:
        return "off" if value is False else value  # YAML reads a bare `off` as false

    aliases: Mapping[str, str] = {}
    """Client-facing names of this route that stand for a served model: `{my-model: Qwen/Qwen3-0.6B}`."""

    @property
    def label(self) -> str:
        return self.name or self.model

    @property
    def is_glob(self) -> bool:
        model = self.model  # three `in` tests, not any() over a generator: read on every request
        return "*" in model or "?" in model or "[" in model
