"""OpenAI's wording of a context-window error, built from the counts, and each engine's own wording
read back into those counts. Client libraries classify context errors by this text (LiteLLM's
ContextWindowExceededError, LangChain's context-overflow handling), so the gateway speaks it."""

from __future__ import annotations

import re


def context_message(window: int, prompt: int, completion: int | None) -> str:
    """OpenAI's sentence; without a known completion, OpenAI's messages-only variant."""
    if completion is None:
        return (
            f"This model's maximum context length is {window} tokens. However, your messages resulted in "
            f"{prompt} tokens. Please reduce the length of the messages."
        )
    return (
        f"This model's maximum context length is {window} tokens. However, you requested {prompt + completion} "
        f"tokens ({prompt} in the messages, {completion} in the completion). Please reduce the length of the "
        "messages or completion."
    )


# Engine wordings whose counts are exact, each as (pattern, group of the window, of the prompt, of the
# completion or 0). vLLM's own "This model's maximum context length is N tokens. However, your prompt
# contains at least M ..." is already OpenAI's phrase, and its M is a lower bound: it is left as it is.
_WORDINGS: tuple[tuple[re.Pattern[str], int, int, int], ...] = (
    # SGLang, prompt + max_tokens over the window
    (
        re.compile(
            r"maximum context length of (\d+) tokens\. You requested a total of \d+ tokens: (\d+) tokens from "
            r"the input messages and (\d+) tokens for the completion"
        ),
        1,
        2,
        3,
    ),
    # SGLang, the prompt alone
    (re.compile(r"input \((\d+) tokens\) is longer than the model's context length \((\d+) tokens\)"), 2, 1, 0),
    # vLLM's input processor
    (re.compile(r"prompt \(length (\d+)\) is longer than the maximum model length of (\d+)"), 2, 1, 0),
    # llama.cpp (n_ctx of one slot)
    (re.compile(r"request \((\d+) tokens\) exceeds the available context size \((\d+) tokens\)"), 2, 1, 0),
    # TensorRT-LLM
    (re.compile(r"prompt_token_ids length \((\d+)\) is greater than max_seq_len \((\d+)\)"), 2, 1, 0),
)


def in_openai_words(message: str) -> str:
    """An engine's context error in OpenAI's words when its counts can be read; else as it was."""
    for pattern, window, prompt, completion in _WORDINGS:
        found = pattern.search(message)
        if found:
            return context_message(
                int(found.group(window)),
                int(found.group(prompt)),
                int(found.group(completion)) if completion else None,
            )
    return message
