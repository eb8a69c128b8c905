"""Token ids of prompts the engines have tokenized, remembered by a chained hash of their messages, so
that a conversation's next turn is matched against the KV index from its remembered prefix without a
round trip. Bounded by the ids it holds; least recently used first out."""

from __future__ import annotations

import json
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from hashlib import blake2b
from typing import Any, Final

from gateway.value import value

DEFAULT_MAX_IDS: Final = 4_000_000
"""Token ids held in all: 16 MB (4 bytes an id), about 400 conversations of 10k tokens."""


@value
class Cut:
    """Where a longer prompt whose text starts as this one's may resume encoding: this prompt's first
    `chars` characters (up to the end of its last special token, such as a turn's start marker)
    gave its first `tokens` ids; `digest` names those characters (text_digest)."""

    chars: int
    tokens: int
    digest: bytes


def text_digest(text: str) -> bytes:
    return blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16, person=b"gw-memo-cut").digest()


def message_keys(seed: str, messages: Sequence[Any]) -> list[bytes]:
    """One key per leading run of messages: keys[k] names messages[: k + 1] under `seed` (the model
    name the engine tokenizes for). Chained, so each message is encoded and hashed once."""
    key = blake2b(seed.encode("utf-8", "surrogatepass"), digest_size=16, person=b"gw-memo").digest()
    out = []
    for message in messages:
        h = blake2b(key, digest_size=16)
        h.update(_canonical(message))
        key = h.digest()
        out.append(key)
    return out


def _canonical(message: Any) -> bytes:
    """A message as bytes that tell it apart from every other message. A plain text message (a role
    and a string content, most of a conversation) skips the JSON encoder, which took most of a short
    conversation's keying: its form starts with a zero byte, which no JSON text does."""
    if type(message) is dict and len(message) == 2:
        role, content = message.get("role"), message.get("content")
        if type(role) is str and type(content) is str:
            name = role.encode("utf-8", "surrogatepass")
            return b"\x00" + len(name).to_bytes(4, "big") + name + content.encode("utf-8", "surrogatepass")
    text = json.dumps(message, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8", "surrogatepass")


def prompt_key(seed: str, prompt: str) -> bytes:
    h = blake2b(seed.encode("utf-8", "surrogatepass"), digest_size=16, person=b"gw-memo-p")
    h.update(prompt.encode("utf-8", "surrogatepass"))
    return h.digest()


class TokenMemo:
    __slots__ = ("_cuts", "_entries", "_held", "max_ids")

    def __init__(self, max_ids: int = DEFAULT_MAX_IDS) -> None:
        self._entries: OrderedDict[bytes, array[int]] = OrderedDict()
        self._cuts: dict[bytes, Cut] = {}
        """The cuts of the entries encoded by a pool's tokenizer (resumable())."""
        self._held = 0
        self.max_ids = max_ids

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def held(self) -> int:
        """Token ids held in all."""
        return self._held

    def get(self, key: bytes) -> array[int] | None:
        ids = self._entries.get(key)
        if ids is not None:
            self._entries.move_to_end(key)
        return ids

    def longest(self, keys: Sequence[bytes]) -> array[int] | None:
        """The ids of the longest leading run whose key is held (keys in order, as message_keys
        gives them), looked for from the longest down."""
        for key in reversed(keys):
            ids = self.get(key)
            if ids is not None:
                return ids
        return None

    def resumable(self, keys: Sequence[bytes]) -> tuple[array[int], Cut] | None:
        """The ids and cut of the longest leading run held with a cut (keys as for longest())."""
        for key in reversed(keys):
            cut = self._cuts.get(key)
            if cut is not None:
                ids = self.get(key)
                if ids is not None:
                    return ids, cut
        return None

    def put(self, key: bytes, tokens: Sequence[int], cut: Cut | None = None) -> None:
        if len(tokens) > self.max_ids:
            return
        try:
            ids = array("I", tokens)
        except OverflowError:  # an id outside 0..2^32-1: no vocabulary has one, so not kept
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self._held -= len(old)
        self._entries[key] = ids
        self._held += len(ids)
        if cut is not None:
            self._cuts[key] = cut
        else:
            self._cuts.pop(key, None)
        while self._held > self.max_ids:
            gone, dropped = self._entries.popitem(last=False)
            self._cuts.pop(gone, None)
            self._held -= len(dropped)

    def clear(self) -> None:
        self._entries.clear()
        self._cuts.clear()
        self._held = 0
