"""Start and stop REAL llama-server, vLLM and SGLang processes for the integration tier.

Binary and model locations come from the environment (LLAMA_SERVER_BIN, TINY_GGUF, VLLM_PYTHON,
TINY_HF_DIR, SGLANG_PYTHON, SGLANG_LIBCUDA_DIR) and fall back to ``$GATEWAY_CI_CACHE/engines.env`` (default cache
``~/.cache/gateway-ci``), which ``tests/engines/setup.sh`` writes. Each server runs as a subprocess in
its own process group on a free loopback port; readiness is a poll of ``GET /health`` until 200 (with
a deadline, and failing fast if the process dies); stop is SIGTERM to the group, then SIGKILL. Output
goes to a log file whose tail is put into every error.

Standard library only, so it also runs under the engine venvs' pythons (setup.sh uses the CLI at the
bottom as a smoke test: ``python servers.py llamacpp|vllm|sglang``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Literal

EngineKind = Literal["llamacpp", "vllm", "sglang"]
MODEL_NAME = "tiny"
ENV_KEYS: dict[EngineKind, tuple[str, ...]] = {
    "llamacpp": ("LLAMA_SERVER_BIN", "TINY_GGUF"),
    "vllm": ("VLLM_PYTHON", "TINY_HF_DIR"),
    # SGLANG_LIBCUDA_DIR holds the stub libcuda.so.1 that lets SGLang's kernel library load without a GPU
    "sglang": ("SGLANG_PYTHON", "TINY_HF_DIR", "SGLANG_LIBCUDA_DIR"),
}
SETUP_HINT = "run `bash tests/engines/setup.sh` (GATEWAY_CI_CACHE selects the cache dir)"


def kv_events_config(pub: int, replay: int) -> str:
    """vLLM's --kv-events-config: bind a PUB socket and a replay socket on these ports."""
    return json.dumps(
        {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://*:{pub}",
            "replay_endpoint": f"tcp://*:{replay}",
            "topic": "kv",
        }
    )


def cache_dir() -> Path:
    return Path(os.environ.get("GATEWAY_CI_CACHE") or Path.home() / ".cache" / "gateway-ci")


def engine_env() -> dict[str, str]:
    """Engine locations: ``$CACHE/engines.env`` (KEY=VALUE lines), overridden by the environment."""
    values: dict[str, str] = {}
    env_file = cache_dir() / "engines.env"
    if env_file.is_file():
        for line in env_file.read_text().splitlines():
            key, sep, value = line.strip().partition("=")
            if sep and not key.startswith("#"):
                values[key.strip()] = value.strip()
    for keys in ENV_KEYS.values():
        for key in keys:
            if os.environ.get(key):
                values[key] = os.environ[key]
    return values


def engine_missing(kind: EngineKind) -> str | None:
    """None when the engine can be started, else a loud, actionable reason (for skip/fail)."""
    env = engine_env()
    problems = []
    for key in ENV_KEYS[kind]:
        value = env.get(key)
        if not value:
            problems.append(f"{key} is not set")
        elif not Path(value).exists():
            problems.append(f"{key}={value} does not exist")
    if not problems:
        return None
    return (
        f"REAL ENGINE {kind!r} NOT AVAILABLE: {'; '.join(problems)} "
        f"(looked in the environment and {cache_dir() / 'engines.env'}); {SETUP_HINT}"
    )


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _http_status(url: str, timeout: float) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            status: int = resp.status
            return status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, ValueError):
        return None


class PortInUseError(RuntimeError):
    """The server could not bind its port (another process holds it)."""


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def group_processes(pgid: int) -> Iterator[Path]:
    """The /proc directory of every live process in group ``pgid`` (an engine and its workers)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.getpgid(int(proc.name)) == pgid:
                yield proc
        except OSError:
            continue


def _group_listens_on(pgid: int, port: int) -> bool | None:
    """Whether a process in group ``pgid`` holds the listening socket on ``port``; None if /proc can't
    tell (not Linux). Guards against a foreign server on the same port answering our /health."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    for proc in group_processes(pgid):
        try:
            for fd in (proc / "fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return True
        except OSError:
            continue
    return False


@dataclass
class EngineServer:
    """A running engine process. ``base_url`` has no trailing slash and no ``/v1``."""

    kind: EngineKind
    host: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    command: list[str]
    max_context: int  # tokens per request: llama.cpp ctx per slot, vLLM max_model_len, SGLang context_length
    parallel: int  # llama.cpp slots / vLLM max_num_seqs / SGLang max_running_requests
    model: str = MODEL_NAME
    ready_seconds: float = 0.0
    _log_file: BinaryIO | None = field(default=None, repr=False)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def v1_url(self) -> str:
        return f"{self.base_url}/v1"

    @property
    def health_url(self) -> str:
        return f"{self.base_url}/health"

    @property
    def metrics_url(self) -> str:
        return f"{self.base_url}/metrics"

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, timeout: float) -> float:
        """Poll /health until it answers 200; return seconds waited. Raise if the process dies."""
        start = time.monotonic()
        deadline = start + timeout
        delay = 0.02
        while True:
            if not self.alive():
                log = self.log_tail(400).lower()
                if "address already in use" in log or "couldn't bind" in log:
                    raise PortInUseError(f"{self.kind}: port {self.port} is taken")
                raise RuntimeError(
                    f"{self.kind} exited with code {self.process.returncode} before becoming ready; "
                    f"command: {' '.join(self.command)}\nlog {self.log_path}:\n{self.log_tail()}"
                )
            if _http_status(self.health_url, timeout=2.0) == 200:
                if _group_listens_on(self.process.pid, self.port) is False:
                    raise PortInUseError(f"{self.kind}: another process answers on port {self.port}")
                self.ready_seconds = time.monotonic() - start
                return self.ready_seconds
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(
                    f"{self.kind} not ready after {timeout:.0f}s on {self.health_url}\n"
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM the process group, wait up to ``grace`` seconds, then SIGKILL it."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=grace)
        # children (vLLM's engine core) may outlive the leader; reap the group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        if self._log_file is not None:
            self._log_file.close()
        return self.process.returncode

    def __enter__(self) -> EngineServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _launch(
    kind: EngineKind,
    build_command: Callable[[int], list[str]],
    *,
    env: Mapping[str, str],
    host: str,
    port: int | None,
    max_context: int,
    parallel: int,
    log_path: Path | None,
    ready_timeout: float,
) -> EngineServer:
    """Start the process and wait until ready. A port we picked that turns out to be taken (a race
    with another process) is retried with a fresh one."""
    attempts = 1 if port else 3
    for attempt in range(1, attempts + 1):
        use_port = port or free_port(host)
        path = log_path
        if path is None:
            path = Path(tempfile.gettempdir()) / "gateway-engines" / f"{kind}-{use_port}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        log_file = path.open("wb")
        command = build_command(use_port)
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            start_new_session=True,
        )
        server = EngineServer(
            kind=kind,
            host=host,
            port=use_port,
            process=process,
            log_path=path,
            command=command,
            max_context=max_context,
            parallel=parallel,
            _log_file=log_file,
        )
        try:
            server.wait_ready(ready_timeout)
            return server
        except PortInUseError:
            server.stop()
            if attempt == attempts:
                raise
        except BaseException:
            server.stop()
            raise
    raise AssertionError("unreachable")


def _require(kind: EngineKind) -> dict[str, str]:
    reason = engine_missing(kind)
    if reason:
        raise RuntimeError(reason)
    return engine_env()


def start_llamacpp(
    *,
    ctx_per_slot: int = 512,
    parallel: int = 4,
    extra_args: Sequence[str] = (),
    host: str = "127.0.0.1",
    port: int | None = None,
    log_path: Path | None = None,
    ready_timeout: float = 60.0,
    alias: str | None = MODEL_NAME,
    model_key: str = "TINY_GGUF",
) -> EngineServer:
    """Start llama-server with ``-c ctx_per_slot*parallel --parallel N --metrics -a tiny``; with
    ``alias=None`` no ``-a``, so that it lists (and ``.model`` is) the model file's path.
    ``model_key="TINY_AGENT_GGUF"`` runs the coding-agent tests' model (a 64k window)."""
    env = _require("llamacpp")
    if model_key not in env:
        raise RuntimeError(f"{model_key} is not set: run bash tests/engines/setup.sh llamacpp")

    def command(port: int) -> list[str]:
        return [
            env["LLAMA_SERVER_BIN"],
            "-m", env[model_key],
            "--host", host,
            "--port", str(port),
            "-c", str(ctx_per_slot * parallel),
            "--parallel", str(parallel),
            "--metrics",
            *(["-a", alias] if alias is not None else []),
            *extra_args,
        ]  # fmt: skip

    server = _launch(
        "llamacpp",
        command,
        env={},
        host=host,
        port=port,
        max_context=ctx_per_slot,
        parallel=parallel,
        log_path=log_path,
        ready_timeout=ready_timeout,
    )
    server.model = alias if alias is not None else env[model_key]
    return server


def start_vllm(
    *,
    max_model_len: int = 1024,
    kv_cache_memory_bytes: int = 64 * 1024 * 1024,
    max_num_seqs: int = 2,
    cpu_omp_threads_bind: str | None = None,
    cpu_affinity: str | None = None,
    extra_args: Sequence[str] = (),
    extra_env: Mapping[str, str] | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
    log_path: Path | None = None,
    ready_timeout: float = 240.0,
) -> EngineServer:
    """Start vLLM's OpenAI server on the CPU. ``cpu_omp_threads_bind`` (e.g. "0", "1") pins the
    replica's compute threads so that two replicas can run side by side; ``cpu_affinity`` (a
    taskset list, e.g. "1") confines all of its processes (API server, engine core, worker) to
    those cores, so that one replica's busy-polling engine core cannot starve the other's worker;
    ``extra_env`` adds to the process's environment (its OTEL_* settings)."""
    env = _require("vllm")
    pin = ["taskset", "-c", cpu_affinity] if cpu_affinity is not None else []

    def command(port: int) -> list[str]:
        return [
            *pin,
            env["VLLM_PYTHON"], "-m", "vllm.entrypoints.openai.api_server",
            "--model", env["TINY_HF_DIR"],
            "--served-model-name", MODEL_NAME,
            "--host", host,
            "--port", str(port),
            "--dtype", "bfloat16",
            "--max-model-len", str(max_model_len),
            "--kv-cache-memory-bytes", str(kv_cache_memory_bytes),
            "--max-num-seqs", str(max_num_seqs),
            "--enforce-eager",
            "--enable-prompt-tokens-details",
            *extra_args,
        ]  # fmt: skip

    proc_env = {
        "VLLM_TARGET_DEVICE": "cpu",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONUNBUFFERED": "1",
        # The tiny model's config says 4,096 positions; the agent tests need a 64k window (random
        # weights: what the extra positions compute does not matter, only that they fit).
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
    }
    if cpu_omp_threads_bind is not None:
        proc_env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_omp_threads_bind
    proc_env.update(extra_env or {})
    return _launch(
        "vllm",
        command,
        env=proc_env,
        host=host,
        port=port,
        max_context=max_model_len,
        parallel=max_num_seqs,
        log_path=log_path,
        ready_timeout=ready_timeout,
    )


def start_sglang(
    *,
    context_length: int = 1024,
    max_running_requests: int = 4,
    mem_fraction_static: float = 0.05,
    extra_args: Sequence[str] = (),
    host: str = "127.0.0.1",
    port: int | None = None,
    log_path: Path | None = None,
    ready_timeout: float = 240.0,
) -> EngineServer:
    """Start SGLang's server on the CPU (``SGLANG_USE_CPU_ENGINE=1``, torch-native attention, no CUDA
    graphs, no warm-up) with ``--enable-metrics`` and ``--enable-cache-report`` (``cached_tokens`` in
    ``usage.prompt_tokens_details``). The CUDA build of its kernel library links one
    libcuda symbol; the stub in ``SGLANG_LIBCUDA_DIR`` (put first on ``LD_LIBRARY_PATH``) provides it.
    ``mem_fraction_static`` of the host's memory goes to the KV cache (0.05 of 24 GiB: about 1 GB)."""
    env = _require("sglang")

    def command(port: int) -> list[str]:
        return [
            env["SGLANG_PYTHON"], "-m", "sglang.launch_server",
            "--model-path", env["TINY_HF_DIR"],
            "--served-model-name", MODEL_NAME,
            "--host", host,
            "--port", str(port),
            "--device", "cpu",
            "--attention-backend", "torch_native",
            "--sampling-backend", "pytorch",
            "--context-length", str(context_length),
            "--max-running-requests", str(max_running_requests),
            "--mem-fraction-static", str(mem_fraction_static),
            "--disable-cuda-graph",
            "--skip-server-warmup",
            "--enable-metrics",
            "--enable-cache-report",
            "--sleep-on-idle",  # else its scheduler spins a whole core while idle, starving the other engines
            *extra_args,
        ]  # fmt: skip

    ld_path = os.pathsep.join(p for p in (env["SGLANG_LIBCUDA_DIR"], os.environ.get("LD_LIBRARY_PATH")) if p)
    proc_env = {
        "SGLANG_USE_CPU_ENGINE": "1",
        "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1",  # as VLLM_ALLOW_LONG_MAX_MODEL_LEN above
        "LD_LIBRARY_PATH": ld_path,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONUNBUFFERED": "1",
    }
    return _launch(
        "sglang",
        command,
        env=proc_env,
        host=host,
        port=port,
        max_context=context_length,
        parallel=max_running_requests,
        log_path=log_path,
        ready_timeout=ready_timeout,
    )


STARTERS: dict[EngineKind, Callable[..., EngineServer]] = {
    "llamacpp": start_llamacpp,
    "vllm": start_vllm,
    "sglang": start_sglang,
}


def _smoke(kind: EngineKind) -> None:
    """Start the engine, run one short chat completion, stop it. Exit status 0 on success."""
    import json

    server = STARTERS[kind]()
    try:
        body = json.dumps(
            {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        ).encode()
        req = urllib.request.Request(
            f"{server.v1_url}/chat/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            reply = json.load(resp)
        content = reply["choices"][0]["message"]["content"]
        tokens = reply["usage"]["completion_tokens"]
        if tokens != 8:
            raise RuntimeError(f"expected 8 completion tokens, got {tokens}: {reply}")
        print(f"{kind} smoke OK: ready in {server.ready_seconds:.1f}s, said {content!r}")
    except BaseException:
        print(f"{kind} smoke FAILED; log {server.log_path}:\n{server.log_tail()}", file=sys.stderr)
        raise
    finally:
        server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Smoke-test a real engine from engines.env / env vars")
    parser.add_argument("kind", choices=list(STARTERS))
    _smoke(parser.parse_args().kind)
