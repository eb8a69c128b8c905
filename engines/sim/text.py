"""The simulator's deterministic tokenizer, ChatML chat rendering, output filler text and embeddings.

Rule: ``<|im_start|>`` and ``<|im_end|>`` are one token each; every other run of text costs one token per
4 UTF-8 bytes, rounded up. A chat prompt is the token list of its ChatML rendering (see ``render_chat``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import struct
import zlib
from collections.abc import Sequence
from typing import Any

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
BYTES_PER_TOKEN = 4
VOCAB = 50_000
# Ids 0..2 are reserved so that hashed text chunks never collide with the special tokens.
_SPECIAL_IDS = {IM_START: 1, IM_END: 2}
_SPECIAL_RE = re.compile(re.escape(IM_START) + "|" + re.escape(IM_END))

_WORDS = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit", "sed", "do")
_ACCENTED = " café"
EMBEDDING_DIM = 8


def tokenize(text: str) -> list[int]:
    """Token ids of ``text``: specials are single tokens, other text is cut into 4-byte chunks."""
    ids: list[int] = []
    pos = 0
    for match in _SPECIAL_RE.finditer(text):
        ids.extend(_chunk_ids(text[pos : match.start()]))
        ids.append(_SPECIAL_IDS[match.group()])
        pos = match.end()
    ids.extend(_chunk_ids(text[pos:]))
    return ids


def _chunk_ids(segment: str) -> list[int]:
    raw = segment.encode()
    # Chunks are cut at byte offsets (not characters) so that the count is exactly ceil(bytes / 4).
    return [3 + zlib.crc32(raw[i : i + BYTES_PER_TOKEN]) % VOCAB for i in range(0, len(raw), BYTES_PER_TOKEN)]


def token_pieces(text: str) -> list[tuple[int, bytes]]:
    """Each token id of ``text`` (outside the specials) with the bytes it stands for."""
    out: list[tuple[int, bytes]] = []
    for segment in _SPECIAL_RE.split(text):
        raw = segment.encode()
        chunks = [raw[i : i + BYTES_PER_TOKEN] for i in range(0, len(raw), BYTES_PER_TOKEN)]
        out.extend((3 + zlib.crc32(c) % VOCAB, c) for c in chunks)
    return out


def count_tokens(text: str) -> int:
    """Same count as ``len(tokenize(text))``, without building the list."""
    total = 0
    pos = 0
    for match in _SPECIAL_RE.finditer(text):
        total += math.ceil(len(text[pos : match.start()].encode()) / BYTES_PER_TOKEN) + 1
        pos = match.end()
    return total + math.ceil(len(text[pos:].encode()) / BYTES_PER_TOKEN)


def message_text(content: Any) -> str:
    """The text of one message's ``content``: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    raise ValueError("message content must be a string or a list of parts")


def render_chat(messages: Sequence[Any], add_generation_prompt: bool = True, tools: Any = None) -> str:
    """ChatML rendering: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message.

    Tools (if any) come first as a ``tools`` turn of canonical JSON, and assistant tool calls are
    appended to their message as JSON, so both cost tokens as they would in a real template.
    Raises ValueError for a malformed message list.
    """
    parts: list[str] = []
    if tools:
        parts.append(f"{IM_START}tools\n{json.dumps(tools, sort_keys=True)}{IM_END}\n")
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ValueError("each message must be an object with a string 'role'")
        text = message_text(message.get("content"))
        if message.get("tool_calls"):
            text += json.dumps(message["tool_calls"], sort_keys=True)
        parts.append(f"{IM_START}{message['role']}\n{text}{IM_END}\n")
    if add_generation_prompt:
        parts.append(f"{IM_START}assistant\n")
    return "".join(parts)


def filler_token(index: int, accented: bool = False) -> str:
    """The text of output token ``index``: cycling words; with ``accented`` every 5th is " café"."""
    if accented and index % 5 == 2:
        return _ACCENTED
    return " " + _WORDS[index % len(_WORDS)]


def filler_text(count: int, accented: bool = False) -> str:
    return "".join(filler_token(i, accented) for i in range(count))


def embedding_base64(text: str) -> str:
    """The same vector as OpenAI's `encoding_format: "base64"` sends it: little-endian float32, base64."""
    vector = embedding(text)
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def embedding(text: str) -> list[float]:
    """A deterministic unit vector of EMBEDDING_DIM floats derived from the text's SHA-256."""
    digest = hashlib.sha256(text.encode()).digest()
    raw = [(digest[i] - 127.5) / 127.5 for i in range(EMBEDDING_DIM)]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [round(x / norm, 6) for x in raw]
