"""Bounds on the request head (docs/reliability.md defect 3 and item 43): a gateway process of
its own, attacked over raw sockets, must cut an oversized head early, answer 431 in OpenAI's shape,
and neither burn CPU nor hold memory for heads it will never serve."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.live.test_demo import free_port

pytestmark = pytest.mark.live

_MB = 1024 * 1024


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """A `gateway serve` process with the default limits (64 KiB head, 100 headers): (port, pid)."""
    port = free_port()
    cfg = tmp_path / "g.yaml"
    pools = "pools: {p: {engine: vllm, backends: [{url: 'http://127.0.0.1:9'}]}}\n"
    cfg.write_text(pools + "routes: [{model: m, pools: [p]}]\n")
    log = tmp_path / "gateway.log"
    with log.open("w") as sink:
        cmd = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg), "--port", str(port)]
        proc = subprocess.Popen([*cmd, "--log-level", "warning"], stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        yield port, proc.pid
    finally:
        proc.kill()
        proc.wait()


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, object]]:
    raw = b""
    with contextlib.suppress(ConnectionError):  # the close after the answer may be a reset
        while chunk := await asyncio.wait_for(reader.read(65536), 10):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower()
    return int(head.split()[1]), json.loads(body)


async def test_a_128_mb_header_is_cut_early_with_little_cpu(gateway: tuple[int, int]) -> None:
    port, pid = gateway
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answer = asyncio.create_task(read_answer(reader))  # read while writing, as the head is refused
    cpu0 = cpu_s(pid)
    writer.write(HEAD + b"x-big: ")
    chunk, sent = b"a" * _MB, 0
    try:
        while sent < 128 * _MB:
            writer.write(chunk)
            await writer.drain()
            sent += len(chunk)
    except (ConnectionError, OSError):
        pass
    status, body = await answer
    writer.close()
    assert status == 431 and body["error"]["code"] == "request_header_fields_too_large"  # type: ignore[index]
    # Cut at 64 KiB: what got through is the kernel's socket buffers, not the 128 MB.
    used = cpu_s(pid) - cpu0
    print(f"128 MB header: {sent / _MB:.0f} MB got in before the cut, {used:.2f} s of gateway CPU")
    assert sent < 48 * _MB, sent
    assert used < 3.0  # it was 30 s of CPU before the limit
    async with httpx.AsyncClient() as client:
        assert (await client.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200


async def test_forty_unfinished_8_mb_headers_hold_no_memory(gateway: tuple[int, int]) -> None:
    port, pid = gateway
    before = rss_mb(pid)
    blob = b"a" * (8 * _MB)

    async def attack() -> tuple[asyncio.Task[tuple[int, dict[str, object]]], asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        answer = asyncio.create_task(read_answer(reader))
        writer.write(HEAD + b"x-big: " + blob)  # and never the end of the head
        with contextlib.suppress(ConnectionError, OSError):
            await writer.drain()
        return answer, writer

    conns = await asyncio.gather(*(attack() for _ in range(40)))
    grown = rss_mb(pid) - before
    print(f"40 unfinished 8 MB heads: gateway RSS {before:.0f} -> {before + grown:.0f} MB")
    for answer, writer in conns:
        status, _ = await answer
        assert status == 431
        writer.close()
    assert grown < 60, f"RSS grew {grown:.0f} MB"  # 40 x 8 MB = 320 MB held before the limit


async def test_too_many_headers_is_431_and_a_normal_head_is_served(gateway: tuple[int, int]) -> None:
    port, _ = gateway
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(HEAD + b"".join(b"x-h%d: v\r\n" % i for i in range(101)) + b"content-length: 2\r\n\r\n{}")
    status, body = await read_answer(reader)
    writer.close()
    assert status == 431 and "header fields" in body["error"]["message"]  # type: ignore[index]
    headers = {f"x-h{i}": "v" * 500 for i in range(90)}  # 90 headers, 45 KB: within both limits
    async with httpx.AsyncClient() as client:
        r = await client.post(f"http://127.0.0.1:{port}/v1/chat/completions", content=b"{", headers=headers)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
