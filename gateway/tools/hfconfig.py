"""Read a Hugging Face model's config.json, for `gateway kv` and `gateway plan` (the one file read
on the KV path; the arithmetic in gateway/policy/kv.py stays pure)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def load_hf_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a ``config.json`` (or the one inside a model directory) into a dict."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise ValueError(f"{p}: expected a JSON object")
    return data
