"""Error rendering: every Retry-After the gateway sends is a sane whole number of seconds, whatever
a backend sent (docs/reliability.md defect 10)."""

from __future__ import annotations

import math

import pytest

from gateway.errors import MAX_RETRY_AFTER_S, GatewayError, Overloaded, parse_retry_after, retry_after_seconds

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 1e300, -5.0, 0.0, 0.2, 7.0, 7.2])
def test_rendered_retry_after_is_clamped_and_never_raises(value: float) -> None:
    header = Overloaded("busy", retry_after=value).headers()["retry-after"]
    assert header.isdigit() and 1 <= int(header) <= MAX_RETRY_AFTER_S


def test_rendered_retry_after_rounds_up() -> None:
    assert retry_after_seconds(7.0) == 7
    assert retry_after_seconds(7.2) == 8  # never earlier than the backend asked
    assert retry_after_seconds(math.inf) == MAX_RETRY_AFTER_S


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, None),
        ("", None),
        ("7", 7.0),
        (" 2.5 ", 2.5),
        ("-3", 0.0),
        ("inf", None),
        ("1e999", None),
        ("nan", None),
        ("1e300", float(MAX_RETRY_AFTER_S)),
        ("soon", None),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 30.0),
    ],
)
def test_backend_retry_after_is_parsed_safely(raw: str | None, expected: float | None) -> None:
    now = 1445412480.0 - 30  # 30 s before the date above
    assert parse_retry_after(raw, now) == expected


def test_no_retry_after_header_without_a_value() -> None:
    assert "retry-after" not in GatewayError("x").headers()


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("you sent Authorization: Bearer upstream-secret-42", "upstream-secret-42"),
        ("headers: {'x-api-key': 'abc123def'}", "abc123def"),
        ('{"api_key": "hunter22"}', "hunter22"),
        ("url ?token=eyJhbGciOi", "eyJhbGciOi"),
        ("your key sk-proj-abcdefgh123 is wrong", "abcdefgh123"),
        ("Basic dXNlcjpwYXNz", "dXNlcjpwYXNz"),
    ],
)
def test_credentials_in_any_error_message_are_redacted(text: str, secret: str) -> None:
    """docs/reliability.md defect 9: an engine's error text quoting its credentials is relayed scrubbed."""
    err = GatewayError(text)
    assert secret not in err.message and secret not in str(err) and "[redacted]" in err.message


@pytest.mark.parametrize(
    "text",
    [
        "This model's maximum context length is 4096 tokens; token limit exceeded",
        "prompt token count: 5000 > 4096",
        "'max_tokens' must be a positive integer, got -1.",
        "Missing or invalid API key.",
    ],
)
def test_ordinary_messages_are_untouched(text: str) -> None:
    assert GatewayError(text).message == text
