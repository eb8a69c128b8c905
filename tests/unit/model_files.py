"""A model's tokenizer files, made for the tests: a word-level tokenizer over a small vocabulary
with a BOS post-processor, and a ChatML template in tokenizer_config.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors

SPECIALS = ["<s>", "<|im_start|>", "<|im_end|>"]
WORDS = ["[UNK]", "system", "user", "assistant", "be", "brief", "which", "rake", "?", "\n", "{", "}", '"', ":", "<"]
CHATML = (
    "{{ bos_token }}{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def write_model(root: Path, config: dict[str, Any] | None = None, template: str | None = CHATML) -> Path:
    vocab = {w: i for i, w in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.add_special_tokens(SPECIALS)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(" "), behavior="removed"),
            pre_tokenizers.Split(Regex(r"\w+|\W"), behavior="isolated"),
        ]
    )
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tok.save(str(root / "tokenizer.json"))
    data = {"bos_token": {"content": "<s>", "special": True}, "eos_token": "<|im_end|>"}
    if template is not None:
        data["chat_template"] = template
    data.update(config or {})
    (root / "tokenizer_config.json").write_text(json.dumps(data))
    return root


def ids_of(*words: str) -> list[int]:
    vocab = SPECIALS + WORDS
    return [vocab.index(w) for w in words]
