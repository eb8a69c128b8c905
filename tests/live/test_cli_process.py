"""The serving commands as a user runs them, each a subprocess: a port that is taken is one line
and exit 1, and a second Ctrl-C during a stream exits quietly, the stream told why it ended."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

pytestmark = pytest.mark.live


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


@pytest.mark.parametrize("command", ["serve", "sim", "demo", "epp"])
def test_a_taken_port_is_one_line_and_exit_1(command: str, taken_port: int) -> None:
    if command == "epp":
        pytest.importorskip("grpc")  # the epp extra
    args = [sys.executable, "-m", "gateway.cli", command, "--port", str(taken_port)]
    if command in ("serve", "epp"):
        args += ["--config", "gateway.yaml"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    lines = [line for line in done.stderr.splitlines() if line.startswith("gateway:")]
    assert lines == [f"gateway: port {taken_port} is in use; pick another with --port"], done.stderr
    assert "error while attempting to bind" not in done.stderr  # uvicorn's own log line, not also ours


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_a_second_ctrl_c_exits_quietly_and_tells_the_stream() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "demo", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    lines: list[str] = []
    first_chunk = threading.Event()

    def stream() -> None:
        body = {"model": "demo", "stream": True, "max_tokens": 500, "messages": [{"role": "user", "content": "hi"}]}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line:
                    lines.append(line)
                    first_chunk.set()

    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "demo did not become ready"
            time.sleep(0.1)
        reader = threading.Thread(target=stream)
        reader.start()
        assert first_chunk.wait(10)
        proc.send_signal(signal.SIGINT)  # drains: the 500-token stream (~10 s) would finish...
        seen = []
        assert proc.stdout is not None
        for line in proc.stdout:  # ...so wait until uvicorn says it is waiting for it, then force it
            seen.append(line)
            if "Waiting for connections to close" in line:
                break
        proc.send_signal(signal.SIGINT)
        reader.join(15)
        out, _ = proc.communicate(timeout=15)
        out = "".join(seen) + out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out
    assert "Traceback" not in out and "Exception in" not in out, out
    last = json.loads(lines[-1].removeprefix("data: "))
    assert last["error"]["code"] == "shutdown", lines[-3:]
    assert "gateway is shutting down" in last["error"]["message"]


SIM = (sys.executable, "-m", "gateway.cli", "sim")


def test_serve_prints_each_model_and_where_it_routes(tmp_path: Path) -> None:
    """`gateway serve` with the shipped gateway.yaml (its URLs pointed at two simulators: simulated
    engines, not real ones) prints, after its first health round, one line per model it found."""
    ports = {"vllm": free_port(), "llamacpp": free_port(), "sglang": free_port()}  # sglang: nothing there
    sims = [
        subprocess.Popen(
            [
                *SIM,
                "--flavour",
                flavour,
                "--port",
                str(ports[flavour]),
                "--model",
                model,
                "--context-limit",
                str(limit),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for flavour, model, limit in (("vllm", "Qwen/Qwen3-0.6B", 1024), ("llamacpp", "/models/tiny.gguf", 512))
    ]
    data = yaml.safe_load(Path("gateway.yaml").read_text())
    for name, pool in data["pools"].items():
        pool["backends"][0]["url"] = f"http://127.0.0.1:{ports[name]}"
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    port = free_port()
    proc: subprocess.Popen[str] | None = None
    try:
        for p in ports["vllm"], ports["llamacpp"]:
            deadline = time.monotonic() + 30
            while not _answers(f"http://127.0.0.1:{p}/health"):
                assert time.monotonic() < deadline, "the simulator did not start"
                time.sleep(0.05)
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config), "--port", str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert proc.stdout is not None
        lines: list[str] = []
        for line in proc.stdout:
            lines.append(line)
            if "any other name" in line:
                break
    finally:
        children: list[subprocess.Popen[Any]] = [*sims, *([proc] if proc else [])]
        for child in children:
            child.send_signal(signal.SIGTERM)
            child.wait(timeout=30)
        if proc is not None and proc.stdout is not None:
            proc.stdout.close()
    models = [line.split(" model ", 1)[1].strip() for line in lines if " model " in line]
    assert models[0] == "Qwen/Qwen3-0.6B -> pool vllm (rule default, route default), window 1024 tokens"
    assert models[1].startswith("/models/tiny.gguf -> pool llamacpp (rule ") and models[1].endswith("window 512 tokens")
    assert models[2].startswith("any other name ('*') -> pool ")
    assert len(models) == 3


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False
