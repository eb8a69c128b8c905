"""Context errors in the words client libraries classify by: OpenAI's sentence with the counts,
checked against the patterns LiteLLM and LangChain match on (read from their source, cited below),
for the gateway's own cap errors and for every engine's context error once normalised."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from engines.adapters import adapter_for
from engines.context_error import context_message, in_openai_words
from gateway.config import CapsConfig
from gateway.errors import ContextLengthExceeded
from gateway.policy.caps import decide

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]

# LiteLLM, BerriAI/litellm litellm/litellm_core_utils/exception_mapping_utils.py (revision 002b24d3),
# ExceptionCheckers.is_error_str_context_window_exceeded, lines 74-105: the lower-cased error string
# is searched for these substrings (lines 84-94); a hit raises ContextWindowExceededError (used by
# _map_openai_exception for OpenAI-compatible providers such as hosted_vllm), which is what
# context_window_fallbacks key on. Two more patterns (lines 97-102) need "current length is"/"while
# limit is" or "maximum input length is" + "tokens"; the sentence below needs neither.
LITELLM_SUBSTRINGS = (
    "exceed context limit",
    "this model's maximum context length is",
    "string too long. expected a string with maximum length",
    "model's maximum context limit",
    "is longer than the model's context length",
    "input tokens exceed the configured limit",
    "`inputs` tokens + `max_new_tokens` must be",
    "exceeds the available context size",
    "exceeds the maximum number of tokens allowed",
)
# ...and lines 79-83 exclude these first: a match on either is NOT a context error.
LITELLM_EXCLUDED = ("string_above_max_length",)


def litellm_says_context_window(error_str: str) -> bool:
    lower = error_str.lower()
    if any(x in lower for x in LITELLM_EXCLUDED):
        return False
    return any(s in lower for s in LITELLM_SUBSTRINGS)


# LangChain, langchain-ai/langchain libs/partners/openai/langchain_openai/chat_models/base.py,
# _handle_openai_bad_request (langchain-openai 1.x): raises OpenAIContextOverflowError (a
# ContextOverflowError, which the summarisation middleware catches) when
# `"context_length_exceeded" in str(e) or "Input tokens exceed the configured limit" in e.message`,
# e being the openai SDK's BadRequestError. Earlier releases (0.3.x; the stored copies of base.py
# around offset 14,100) have no such branch. langchain-openai depends on openai < 3, whose
# _base_client.py (_make_status_error_from_response) renders str(e) as
# f"Error code: {status} - {body}" with the whole parsed body, so the `code` field is what matches
# (openai 3.x, installed here, puts only the message in str(e); hence the rendering is rebuilt).
def langchain_says_context_overflow(e: openai.BadRequestError) -> bool:
    as_openai_2 = f"Error code: {e.status_code} - {e.body}"
    return "context_length_exceeded" in as_openai_2 or "Input tokens exceed the configured limit" in e.message


def as_openai_error(body: bytes, status: int = 400) -> openai.BadRequestError:
    """What the official openai client raises for this response (no socket: httpx's MockTransport)."""
    transport = httpx.MockTransport(
        lambda request: httpx.Response(status, content=body, headers={"content-type": "application/json"})
    )
    # openai 1.x types this as an httpx.Client, 3.x as an httpx2.Client; both accept httpx's at run time.
    http_client: Any = httpx.Client(transport=transport)
    client = openai.OpenAI(base_url="http://gateway.invalid/v1", api_key="k", max_retries=0, http_client=http_client)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    client.close()
    return info.value


def gateway_errors() -> list[ContextLengthExceeded]:
    caps = CapsConfig(max_context_tokens=1000)
    return [
        ContextLengthExceeded(decide(caps, 1234, 50).message, param="messages"),
        ContextLengthExceeded(decide(caps, 1234, None).message, param="messages"),
    ]


def test_the_sentence_is_openais() -> None:
    assert context_message(4097, 135, 4000) == (
        "This model's maximum context length is 4097 tokens. However, you requested 4135 tokens "
        "(135 in the messages, 4000 in the completion). Please reduce the length of the messages or completion."
    )
    assert context_message(8192, 8516, None) == (
        "This model's maximum context length is 8192 tokens. However, your messages resulted in 8516 tokens. "
        "Please reduce the length of the messages."
    )


def test_the_gateways_cap_errors_keep_the_counts() -> None:
    with_output, without = (e.message for e in gateway_errors())
    assert "maximum context length is 1000 tokens" in with_output
    assert "you requested 1284 tokens (1234 in the messages, 50 in the completion)" in with_output
    assert "your messages resulted in 1234 tokens" in without
    assert "gateway route's context cap" in with_output


@pytest.mark.parametrize("index", [0, 1])
def test_the_gateways_cap_errors_are_context_errors_to_litellm_and_langchain(index: int) -> None:
    err = gateway_errors()[index]
    sdk_error = as_openai_error(err.body_bytes())
    assert sdk_error.code == "context_length_exceeded"
    # LiteLLM's error_str is str(original_exception): the SDK's "Error code: 400 - {...}".
    assert litellm_says_context_window(str(sdk_error))
    assert litellm_says_context_window(err.message)
    assert langchain_says_context_overflow(sdk_error)


def context_cases() -> list[dict[str, Any]]:
    cases = json.loads((ROOT / "tests/fixtures/engines/errors.json").read_text())["cases"]
    return [c for c in cases if c["expect"].get("code") == "context_length_exceeded"]


@pytest.mark.parametrize("case", context_cases(), ids=lambda c: c["name"])
def test_engine_context_errors_are_context_errors_to_litellm_and_langchain(case: dict[str, Any]) -> None:
    norm = adapter_for(case["engine"]).normalise_error(case["status"], case["body"].encode())
    body = {"error": {"message": norm.message, "type": norm.type, "param": norm.param, "code": norm.code}}
    sdk_error = as_openai_error(json.dumps(body).encode())
    assert langchain_says_context_overflow(sdk_error)
    if case["engine"] != "openai":  # OpenAI's own "exceeds the context window" is passed on as it is
        assert litellm_says_context_window(norm.message), norm.message


@pytest.mark.parametrize(
    ("engine_text", "expected"),
    [
        (
            "Requested token count exceeds the model's maximum context length of 1024 tokens. You requested a "
            "total of 1100 tokens: 92 tokens from the input messages and 1008 tokens for the completion. Please "
            "reduce the number of tokens in the input messages or the completion to fit within the limit.",
            context_message(1024, 92, 1008),
        ),
        (
            "The input (5610 tokens) is longer than the model's context length (1024 tokens).",
            context_message(1024, 5610, None),
        ),
        (
            "The decoder prompt (length 1100) is longer than the maximum model length of 1024. Make sure that "
            "`max_model_len` is no smaller than the number of text tokens.",
            context_message(1024, 1100, None),
        ),
        (
            "request (3615 tokens) exceeds the available context size (512 tokens), try increasing it",
            context_message(512, 3615, None),
        ),
        ("prompt_token_ids length (5000) is greater than max_seq_len (4096)", context_message(4096, 5000, None)),
        # vLLM's own sentence is already OpenAI's, and its "at least" count is a bound: kept as it is.
        (
            "This model's maximum context length is 1024 tokens. However, your prompt contains at least 1025 "
            "input tokens, and the request asks for 8 output tokens.",
            None,
        ),
    ],
)
def test_engine_wordings_in_openai_words(engine_text: str, expected: str | None) -> None:
    assert in_openai_words(engine_text) == (engine_text if expected is None else expected)
