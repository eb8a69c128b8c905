"""Shared tokenizer and output-bias recipe for the tiny generated test models.

Both tiny models (the GGUF for llama.cpp and the HF checkpoint for vLLM) use the same byte-level BPE
vocabulary, built here deterministically from a fixed paragraph, so that both engines tokenize text the
same way. Layout: ids 0..255 are the GPT-2 byte tokens, then the learned merges, then the three special
tokens, for exactly ``VOCAB_SIZE`` tokens.

Random weights emit arbitrary bytes, and llama-server answers HTTP 500 on output that is not valid
UTF-8, so ``banned_token_mask`` marks every token whose text is not plain printable ASCII (plus the
special tokens, EOS included) so that the generators can give them a logit of about -100. Generation
then always runs to ``max_tokens``.

Only the standard library is used, so this module can run under any of the engine venvs.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter

VOCAB_SIZE = 512
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
N_MERGES = VOCAB_SIZE - 256 - len(SPECIAL_TOKENS)

# ChatML. Rendered with add_generation_prompt it ends in "<|im_start|>assistant\n".
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

CORPUS = (
    "The gateway sits in front of several inference engines and speaks one protocol to every client. "
    "It routes each request to a replica, streams the tokens back as they are generated, and counts "
    "everything it sees: prompt tokens, completion tokens, cached tokens, queue time and latency. "
    "When a replica is slow or broken, the gateway stops sending it traffic and tries another one. "
    "When a client disconnects in the middle of a stream, the gateway closes its own upstream "
    "connection so that the engine can free the slot for the next request in the queue. "
    "Short prompts with a shared prefix should land on the same replica, because the engine keeps the "
    "prefix in its cache and can skip the work of reading it again. Long prompts that do not fit in "
    "the context window are rejected early with a clear error message, before any tokens are streamed. "
    "Operators read the metrics to learn how many requests are running, how many are waiting, how full "
    "the cache is, and how quickly the first token arrives. The numbers 0123456789 appear in counters, "
    "in ports such as 8080 and 8000, and in timestamps like 2024-05-17 12:34:56. Punctuation matters "
    'too: commas, periods, colons; quotes "like this", (parentheses), [brackets] and {braces}, '
    "dashes - and underscores _, slashes / and backslashes \\, plus signs + and equals signs =, "
    "question marks? and exclamation marks! A quick brown fox jumps over the lazy dog while the "
    "engine generates gibberish from random weights, and that is fine, because the tests care about "
    "protocol, timing, load and errors, not about prose."
)

# GPT-2 pre-tokenizer regex, restricted to ASCII classes (the corpus is ASCII).
_PRETOKENIZE = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")


def bytes_to_unicode() -> dict[int, str]:
    """The GPT-2 byte -> printable unicode character table used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def train_merges(n_merges: int = N_MERGES) -> list[tuple[str, str]]:
    """Learn ``n_merges`` BPE merges from CORPUS; ties broken by the pair's text, so deterministic."""
    table = bytes_to_unicode()
    words = Counter(tuple(table[b] for b in piece.encode("utf-8")) for piece in _PRETOKENIZE.findall(CORPUS))
    merges: list[tuple[str, str]] = []
    while len(merges) < n_merges:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            for pair in itertools.pairwise(word):
                pairs[pair] += count
        if not pairs:
            raise RuntimeError(f"corpus too small: only {len(merges)} merges possible")
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        merged: Counter[tuple[str, ...]] = Counter()
        for word, count in words.items():
            out: list[str] = []
            i = 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += count
        words = merged
    return merges


def build_vocab() -> tuple[list[str], list[tuple[str, str]]]:
    """Return (tokens in id order, merges). len(tokens) == VOCAB_SIZE."""
    table = bytes_to_unicode()
    tokens = [table[b] for b in range(256)]
    merges = train_merges()
    seen = set(tokens)
    for a, b in merges:
        if a + b in seen:  # cannot happen with a proper BPE, but keep ids unique regardless
            raise RuntimeError(f"duplicate merge result {a + b!r}")
        tokens.append(a + b)
        seen.add(a + b)
    tokens.extend(SPECIAL_TOKENS)
    assert len(tokens) == VOCAB_SIZE, len(tokens)
    return tokens, merges


def token_bytes(token: str) -> bytes:
    """The raw bytes a (non-special) byte-level token stands for."""
    inverse = {c: b for b, c in bytes_to_unicode().items()}
    return bytes(inverse[c] for c in token)


def banned_token_mask(tokens: list[str]) -> list[bool]:
    """True for tokens the tiny models must never emit: specials, and anything not plain printable
    ASCII (0x20..0x7e). '<' and '>' are banned too, so that no output looks like a tag (<think>...)."""
    banned: list[bool] = []
    for tok in tokens:
        if tok in SPECIAL_TOKENS:
            banned.append(True)
            continue
        raw = token_bytes(tok)
        banned.append(not all(0x20 <= b <= 0x7E and b not in b"<>" for b in raw))
    return banned
