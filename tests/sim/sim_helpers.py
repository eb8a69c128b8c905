"""Helpers for the simulator's tests: a raw HTTP/1.1 client on asyncio streams (so tests can see exact
bytes, FIN vs RST, and disconnect at any point) and SSE parsing."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from engines.sim.server import SimServer

# make_sim(flavour="vllm", preset="fast", **overrides) -> a started SimServer (see conftest.py)
SimFactory = Callable[..., Awaitable[SimServer]]
CHAT_PATH = "/v1/chat/completions"


def chat_body(content: str = "hello", **extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": content}], **extra}


def request_bytes(method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> bytes:
    data = b"" if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    lines = [f"{method} {path} HTTP/1.1", "host: sim"]
    if body is not None:
        lines += ["content-type: application/json", f"content-length: {len(data)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


@dataclass
class RawConn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    @classmethod
    async def open(cls, port: int) -> RawConn:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    async def send(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> None:
        self.writer.write(request_bytes(method, path, body, headers))
        await self.writer.drain()

    async def head(self) -> tuple[int, dict[str, str]]:
        raw = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.lower()] = value.strip()
        return status, headers

    async def chunk(self) -> bytes:
        """One chunk of a chunked body; b"" for the terminating chunk."""
        size = int((await self.reader.readuntil(b"\r\n"))[:-2], 16)
        data = await self.reader.readexactly(size + 2)
        return data[:-2]

    async def body(self, headers: dict[str, str]) -> bytes:
        if headers.get("transfer-encoding") == "chunked":
            parts = []
            while part := await self.chunk():
                parts.append(part)
            return b"".join(parts)
        return await self.reader.readexactly(int(headers.get("content-length", "0")))

    async def response(self) -> tuple[int, dict[str, str], bytes]:
        status, headers = await self.head()
        return status, headers, await self.body(headers)

    async def event(self) -> str:
        """The payload of the next SSE ``data:`` event of a chunked stream (one event per chunk)."""
        chunk = await self.chunk()
        assert chunk.startswith(b"data: ") and chunk.endswith(b"\n\n"), chunk
        return chunk[6:-2].decode()

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


def sse_payloads(body: bytes) -> list[str]:
    """The ``data:`` payloads of an SSE body, in order."""
    return [line[6:] for line in body.decode().split("\n") if line.startswith("data: ")]


def sse_json(body: bytes) -> list[dict[str, Any]]:
    """The JSON events of an SSE body, without the final ``[DONE]``."""
    payloads = sse_payloads(body)
    assert payloads[-1] == "[DONE]", payloads[-3:]
    return [json.loads(p) for p in payloads[:-1]]


def content_of(events: list[dict[str, Any]]) -> str:
    """Concatenated generated text of chat (delta.content) or completion (text) events."""
    out = []
    for e in events:
        for choice in e.get("choices", []):
            out.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
    return "".join(out)


def metric(text: str, name: str) -> float:
    """Sum of the samples of ``name`` in a Prometheus exposition."""
    total = 0.0
    found = False
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    assert found, f"{name} not in /metrics"
    return total


def metric_names(text: str) -> set[str]:
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
