"""A model's tokenizer and chat template, loaded from its files (a pool's `tokenizer`), to give a
prompt's token ids as the engine will see them without asking the engine: the kv_events match's
ids. Renders the template the way Hugging Face transformers does (a sandboxed Jinja environment
with trim_blocks, lstrip_blocks, loop controls, `raise_exception`, `strftime_now` and its `tojson`;
the special tokens as variables) and encodes the text with the `tokenizers` library, without adding
special tokens for a chat (the template writes them, and vLLM and SGLang add none) and with them for
a plain prompt. Only the shapes whose rendering has no engine-side step are taken: text messages
(role, string content, optional name) and no request option that changes the template; anything
else returns None and is asked of the engine (pipeline/prompt_tokens.py, which also checks these
ids against the engine's from time to time).

Needs the `kv-events` extra (tokenizers, jinja2), imported when a pool names a tokenizer."""

from __future__ import annotations

import json
import threading
from array import array
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from gateway.pipeline.token_memo import Cut, text_digest

TEXT_KEYS: Final = frozenset({"role", "content", "name"})
"""A message's keys that the local rendering takes; another key (tool_calls, a list content...)
is rendered by the engine after its own parsing, so such a prompt is asked of the engine."""
TEMPLATE_OPTIONS: Final = frozenset(
    {
        "tools",
        "functions",
        "documents",
        "chat_template",
        "chat_template_kwargs",
        "add_generation_prompt",
        "continue_final_message",
        "add_special_tokens",
        "mm_processor_kwargs",
        "reasoning_effort",
    }
)
"""Request fields that change what the engine renders or encodes: a request with one is asked of
the engine."""
PIECE_CHARS: Final = 4_000_000
"""The pieces' cache holds at most this many characters of text (with their ids, 4 bytes each:
about 12 MB for text of 4 characters a token); past it the oldest pieces go."""
SPECIAL_TOKENS: Final = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


class TokenizerError(ValueError):
    """A pool's tokenizer files cannot be used (or the extra is missing): the gateway does not start."""


class ChatTokenizer:
    """One model's files: its `tokenizers.Tokenizer` and its compiled chat template."""

    def __init__(self, path: str, encoder: Any, template: Any, variables: Mapping[str, Any]) -> None:
        self.path = path
        self._encoder = encoder
        self._template = template
        self._variables = dict(variables)
        added = encoder.get_added_tokens_decoder()
        self._specials = frozenset(i for i, t in added.items() if t.special)
        """The special tokens' ids and texts: the tokenizer splits its input at each before encoding
        the pieces in between, so ids never merge across one (resume())."""
        self._special_texts = tuple({t.content for t in added.values() if t.special and t.content})
        self._pieces: dict[str, array[int]] = {}
        """A chat text's pieces (each ending just after a special token, or the text's end) -> their
        ids: a system prompt, a tool list or a conversation's opening that many prompts share is
        encoded once (encode_chat with `pieces`)."""
        self._piece_chars = 0
        self._evicting = threading.Lock()
        """The event loop's thread and the worker thread both add pieces; a read needs no lock."""

    @classmethod
    def load(cls, path: str) -> ChatTokenizer:
        """From a model directory: tokenizer.json, and the chat template in chat_template.jinja or
        tokenizer_config.json's `chat_template` (its `default` when it names several).
        TokenizerError when a file is missing or unreadable, or the extra is not installed."""
        try:
            import jinja2.ext
            import jinja2.sandbox
            from tokenizers import Tokenizer
        except ModuleNotFoundError as exc:
            raise ImportError(f"a pool's `tokenizer` needs {exc.name}: pip install 'llm-gateway[kv-events]'") from exc
        root = Path(path)
        config = _read_json(root / "tokenizer_config.json") if (root / "tokenizer_config.json").is_file() else {}
        try:
            encoder = Tokenizer.from_file(str(root / "tokenizer.json"))
        except Exception as exc:  # tokenizers raises its own Exception subclass
            raise TokenizerError(f"tokenizer {path}: cannot read tokenizer.json ({exc})") from exc
        source = _template_source(root, config)
        if source is None:
            raise TokenizerError(f"tokenizer {path}: no chat template (chat_template.jinja or tokenizer_config.json)")
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = _strftime_now
        try:
            template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise TokenizerError(f"tokenizer {path}: the chat template does not compile ({exc})") from exc
        variables: dict[str, Any] = {name: _token_text(config.get(name)) for name in SPECIAL_TOKENS}
        variables["additional_special_tokens"] = [
            _token_text(t) for t in config.get("additional_special_tokens") or () if _token_text(t) is not None
        ]
        return cls(path, encoder, template, variables)

    def chat_text(self, body: Mapping[str, Any]) -> str | None:
        """The chat body's prompt as the engine renders it; None when the body is not of the shapes
        taken (module docstring) or the template fails on it."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or any(k in body for k in TEMPLATE_OPTIONS):
            return None
        for message in messages:
            if not isinstance(message, dict) or not TEXT_KEYS.issuperset(message):
                return None
            if not isinstance(message.get("role"), str) or not isinstance(message.get("content"), str):
                return None
        try:
            text = self._template.render(messages=messages, add_generation_prompt=True, **self._variables)
        except Exception:  # a template's raise_exception, or any error of its own: the engine decides
            return None
        return text if isinstance(text, str) else None

    def ids(self, body: Mapping[str, Any]) -> list[int] | None:
        """The body's prompt ids (its `messages`, else its `prompt` string); None: asked of the engine."""
        text = self.prompt_text(body)
        return self.encode(*text) if text is not None else None

    def prompt_text(self, body: Mapping[str, Any]) -> tuple[str, bool] | None:
        """The body's prompt as the engine encodes it, and whether the tokenizer's own special tokens
        are added (a plain prompt) or not (a chat: its template writes them); None: asked of the engine."""
        if "messages" in body:
            text = self.chat_text(body)
            return (text, False) if text is not None else None
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or any(k in body for k in TEMPLATE_OPTIONS):
            return None
        return prompt, True

    def encode_chat(self, text: str, release: bool = False, pieces: bool = False) -> tuple[list[int], Cut | None]:
        """A chat text's ids (no special tokens added) and its cut (None: no special token in it).
        `pieces`: encoded piece by piece, each piece's ids remembered (pieced())."""
        ids = self.pieced(text, release) if pieces else self.encode(text, False, release=release)
        return ids, self._cut(text, ids, 0, 0)

    def pieced(self, text: str, release: bool = False) -> list[int]:
        """A chat text's ids, from its pieces: the text cut just after each special token, each piece
        encoded alone, or taken from the pieces' cache. The same ids as the whole text's where the
        tokenizer splits its input at special tokens before encoding what lies between them (as
        resume() has it; the caller checks that now and then)."""
        ends = sorted({at + len(s) for s in self._special_texts for at in _occurrences(text, s)})
        if not ends or ends[-1] != len(text):
            ends.append(len(text))
        ids: list[int] = []
        start = 0
        for end in ends:
            piece = text[start:end]
            known = self._pieces.get(piece)
            if known is None:
                encoded = self.encode(piece, False, release=release)
                self._remember(piece, encoded)
                ids += encoded
            else:
                ids += known
            start = end
        return ids

    def _remember(self, piece: str, ids: list[int]) -> None:
        with self._evicting:
            if piece in self._pieces:
                return
            self._pieces[piece] = array("I", ids)
            self._piece_chars += len(piece)
            while self._piece_chars > PIECE_CHARS and self._pieces:
                oldest = next(iter(self._pieces))
                self._piece_chars -= len(oldest)
                del self._pieces[oldest]

    def resume(
        self, text: str, ids: Sequence[int], cut: Cut, release: bool = False, pieces: bool = False
    ) -> tuple[list[int], Cut | None] | None:
        """encode_chat(text) from an earlier prompt's `ids` and `cut`, encoding only what follows the
        cut: the same ids, because the tokenizer encodes the pieces between special tokens apart.
        None when `text` does not start with the earlier prompt's text up to the cut (the template
        rendered its earlier messages differently)."""
        if len(text) < cut.chars or text_digest(text[: cut.chars]) != cut.digest:
            return None
        rest = (
            self.pieced(text[cut.chars :], release)
            if pieces
            else self.encode(text[cut.chars :], False, release=release)
        )
        return [*ids[: cut.tokens], *rest], self._cut(text, rest, cut.chars, cut.tokens) or cut

    def _cut(self, text: str, ids: Sequence[int], chars: int, tokens: int) -> Cut | None:
        """The cut after the last special token of `ids`, the ids of text[chars:] (which follow
        `tokens` ids), or None when they hold none."""
        last = next((i for i in range(len(ids) - 1, -1, -1) if ids[i] in self._specials), None)
        if last is None:
            return None
        found = [(text.rfind(s, chars), len(s)) for s in self._special_texts]
        end = max((at + size for at, size in found if at >= 0), default=-1)
        if end < 0:
            return None
        return Cut(end, tokens + last + 1, text_digest(text[:end]))

    def encode(self, text: str, special: bool, release: bool = False) -> list[int]:
        """`text`'s token ids; `special`: with the tokenizer's own special tokens (a plain prompt).
        `release`: let other threads run meanwhile (a worker thread's encode); `tokenizers` holds
        the GIL through `encode` and releases it only in `encode_batch`, which costs the same for
        one text. On the event loop's thread it is held: the encode is short there, and a release
        could wait a whole switch interval to get the GIL back. The released encode is
        `encode_batch_fast`, which leaves out the offsets (unused here): a tenth less CPU."""
        if release:
            batch: list[int] = self._encoder.encode_batch_fast([text], add_special_tokens=special)[0].ids
            return batch
        ids: list[int] = self._encoder.encode(text, add_special_tokens=special).ids
        return ids


def _occurrences(text: str, sub: str) -> list[int]:
    out = []
    at = text.find(sub)
    while at >= 0:
        out.append(at)
        at = text.find(sub, at + len(sub))
    return out


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"cannot read {path} ({exc})") from exc
    return data if isinstance(data, dict) else {}


def _template_source(root: Path, config: Mapping[str, Any]) -> str | None:
    jinja = root / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _token_text(token: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken's mapping."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else None


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # transformers' own: no HTML escaping, unlike Jinja's built-in tojson.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message: str) -> None:
    raise ValueError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)
