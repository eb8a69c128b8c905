"""Helpers for the protocol translators' tests: load the real engines' recordings under
tests/fixtures/<engine>/protocols/ and compare shapes (event types in order, key paths)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ENGINES = ("vllm", "llamacpp")


def load(engine: str, name: str) -> dict[str, Any]:
    record: dict[str, Any] = json.loads((FIXTURES / engine / "protocols" / f"{name}.json").read_text())
    return record


def stream_bytes(engine: str, name: str) -> bytes:
    return (FIXTURES / engine / "protocols" / f"{name}.sse.txt").read_bytes()


def request_body(engine: str, name: str) -> dict[str, Any]:
    body: dict[str, Any] = load(engine, name)["request"]["body"]
    return body


def events(data: bytes) -> list[tuple[str | None, dict[str, Any]]]:
    """(event name, parsed data) for each event of an SSE body; [DONE] is skipped."""
    out: list[tuple[str | None, dict[str, Any]]] = []
    for block in data.replace(b"\r\n", b"\n").split(b"\n\n"):
        name = None
        payload = None
        for line in block.split(b"\n"):
            if line.startswith(b"event:"):
                name = line[6:].strip().decode()
            elif line.startswith(b"data:"):
                payload = line[5:].strip()
        if payload is None or payload == b"[DONE]":
            continue
        out.append((name, json.loads(payload)))
    return out


def squeeze(kinds: Iterable[str]) -> list[str]:
    """Event types with runs of the same type collapsed (how many deltas is the model's business)."""
    out: list[str] = []
    for kind in kinds:
        if not out or out[-1] != kind:
            out.append(kind)
    return out


def key_paths(value: Any, prefix: str = "") -> set[str]:
    """Every key path in a JSON value (list elements share the path ``[]``)."""
    paths: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{prefix}.{key}" if prefix else key
            paths.add(path)
            paths |= key_paths(item, path)
    elif isinstance(value, list):
        for item in value:
            paths |= key_paths(item, prefix + "[]")
    return paths


def feed_in_pieces(feed: Callable[[bytes], bytes], data: bytes, seed: int) -> bytes:
    """Feed ``data`` split at random points (a single byte at times), as a network delivers it."""
    rng = random.Random(seed)
    out = b""
    i = 0
    while i < len(data):
        step = rng.choice((1, 2, 7, 64, 500, 4096))
        out += feed(data[i : i + step])
        i += step
    return out
