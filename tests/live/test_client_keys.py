"""Client keys (docs/configuration.md `keys`): hashed and environment keys,
a per-key model allowlist, per-key requests and tokens per minute with 429 + Retry-After in
OpenAI's shape, counted per replica (no Redis here; tests/live/test_redis_limits.py shares them)."""

from __future__ import annotations

import asyncio
import hashlib

import httpx
import pytest

from tests.live.conftest import StackFactory, chat, fresh_minute

pytestmark = pytest.mark.live


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def error_of(r: httpx.Response, status: int) -> dict[str, object]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]  # type: ignore[no-any-return]


async def test_hashed_key_and_model_allowlist(make_stack: StackFactory) -> None:
    hashed = "sha256:" + hashlib.sha256(b"sk-team").hexdigest()
    stack = await make_stack(
        routes=[{"model": "tiny", "pools": ["vllm"]}, {"model": "big", "pools": ["vllm"]}],
        keys=[{"name": "team", "key": hashed, "models": ["tiny"]}],
    )
    url = stack.base_url + "/v1/chat/completions"
    async with httpx.AsyncClient(timeout=10) as client:
        ok = await client.post(url, json=chat(max_tokens=1), headers=bearer("sk-team"))
        assert ok.status_code == 200
        err = error_of(await client.post(url, json=chat(model="big"), headers=bearer("sk-team")), 403)
        assert err["code"] == "model_not_allowed" and err["param"] == "model"
        error_of(await client.post(url, json=chat(), headers=bearer(hashed)), 401)  # the digest is no key
        models = await client.get(stack.base_url + "/v1/models", headers=bearer("sk-team"))
        assert [m["id"] for m in models.json()["data"]] == ["tiny"]
    assert stack.sims["vllm-0"].stats.seen == 1
    assert stack.total("gateway_requests_total", outcome="rejected_4xx") == 2


async def test_requests_per_minute_is_429_with_retry_after(make_stack: StackFactory) -> None:
    stack = await make_stack(
        keys=[
            {"name": "small", "key": "sk-small", "requests_per_minute": 3},
            {"name": "other", "key": "sk-other", "requests_per_minute": 3},
        ]
    )
    url = stack.base_url + "/v1/chat/completions"
    await fresh_minute()
    async with httpx.AsyncClient(timeout=10) as client:
        codes = [
            (await client.post(url, json=chat(max_tokens=1), headers=bearer("sk-small"))).status_code for _ in range(4)
        ]
        refused = await client.post(url, json=chat(max_tokens=1), headers=bearer("sk-small"))
        other = await client.post(url, json=chat(max_tokens=1), headers=bearer("sk-other"))
    assert codes == [200, 200, 200, 429]
    err = error_of(refused, 429)
    assert err["type"] == "requests" and err["code"] == "rate_limit_exceeded"
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert "sk-small" not in refused.text
    assert other.status_code == 200  # the other key has its own count
    assert stack.sims["vllm-0"].stats.seen == 4  # three of one key, one of the other
    assert stack.metric("gateway_rate_limited_total", key="small", limit="requests") == 2
    assert stack.total("gateway_requests_total", outcome="rejected_4xx") == 2  # the client's quota, not overload


async def test_tokens_per_minute_counts_usage_when_requests_end(make_stack: StackFactory) -> None:
    stack = await make_stack(keys=[{"name": "t", "key": "sk-t", "tokens_per_minute": 30}])
    url = stack.base_url + "/v1/chat/completions"
    await fresh_minute()
    async with httpx.AsyncClient(timeout=10) as client:
        first = await client.post(url, json=chat(max_tokens=40, stream=True), headers=bearer("sk-t"))
        assert first.status_code == 200
        await stack.wait_metric("gateway_requests_total", 1, outcome="success")
        second = await client.post(url, json=chat(max_tokens=1), headers=bearer("sk-t"))
    err = error_of(second, 429)
    assert err["type"] == "tokens" and "retry-after" in second.headers
    assert stack.metric("gateway_rate_limited_total", key="t", limit="tokens") == 1


async def test_trailing_whitespace_is_not_part_of_a_header_value(make_stack: StackFactory) -> None:
    """RFC 9110 5.5: whitespace after a field value is not part of it (httptools keeps it)."""
    stack = await make_stack(routes=[{"model": "tiny", "pools": ["vllm"]}], keys=[{"name": "team", "key": "sk-team"}])
    host, port = stack.base_url.removeprefix("http://").split(":")
    body = b'{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":1}'
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer sk-team \t\r\n"
        b"x-request-id: req-7  \r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
        % len(body)
    )
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head + body)
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    assert b"\r\nx-request-id: req-7\r\n" in answer.split(b"\r\n\r\n")[0], answer[:600]
    assert stack.sims["vllm-0"].stats.seen == 1
