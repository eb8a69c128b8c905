"""What every section of gateway.yaml shares: the frozen base model, the name pattern, and the
kinds the sections choose from."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict

EngineKind = Literal["vllm", "sglang", "llamacpp", "trtllm", "lmdeploy", "nim", "ollama", "openai", "sim"]
BalancerKind = Literal["least_load", "prefix_affinity", "round_robin", "session", "first_healthy", "kv_events"]
PlatformName = Literal["auto", "mac", "no_nvidia_gpu", "nvidia_gpu"]
Priority = Literal["interactive", "default", "batch"]
"""Priority classes, highest first (gateway/policy/priority.py ranks them; docs/sharing.md)."""

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"


class Section(BaseModel):
    """A section of gateway.yaml: frozen, and a key it does not know is an error."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def http_url(url: str | None, name: str) -> str | None:
    """`url` when it is None or an http:// or https:// URL with a host; else a ValueError naming the key."""
    if url is not None and not re.match(r"^https?://[^/\s]+", url):
        raise ValueError(f"{name} must be an http:// or https:// URL")
    return url
