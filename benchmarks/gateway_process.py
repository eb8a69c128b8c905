"""A gateway replica in a process of its own, for the benchmarks: `gateway serve` on a config written
to a file, as a replica is deployed. Its metrics are read from its /metrics and its CPU from /proc,
so nothing of the benchmark's own threads (its clients, its samplers) shares its GIL or is counted
as its work."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def cpu_seconds(tid: int, pid: int | str = "self") -> float:
    """utime + stime of a thread (/proc/PID/task/TID) or, with tid 0, of a process (/proc/PID)."""
    path = f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat"
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class GatewayProcess:
    """`data`: the config (its server port is the one `start` picks); `workdir`: where the config
    and the log go, kept after `stop` (default: a temporary directory, removed)."""

    def __init__(self, data: dict[str, Any], log_level: str = "warning", workdir: Path | None = None) -> None:
        self._data = data
        self._log_level = log_level
        self._temp: tempfile.TemporaryDirectory[str] | None = None
        if workdir is None:
            self._temp = tempfile.TemporaryDirectory(prefix="gateway-replica-")
            workdir = Path(self._temp.name)
        self._dir = workdir
        self._proc: subprocess.Popen[bytes] | None = None
        self.base_url = ""

    @property
    def log_path(self) -> Path:
        return self._dir / "gateway.log"

    def start(self, timeout: float = 30.0, ready: str = "/healthz") -> GatewayProcess:
        """Start it and wait until `ready` answers 200."""
        self._dir.mkdir(parents=True, exist_ok=True)
        config = self._dir / "gateway.yaml"
        config.write_text(yaml.safe_dump(self._data), encoding="utf-8")
        port = free_port()
        # after the caller's PYTHONPATH: a compiled build put there is the gateway that runs
        path = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT)]))
        env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}  # its log read as it runs
        cmd = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config), "--port", str(port)]
        with self.log_path.open("wb") as log:
            self._proc = subprocess.Popen(
                [*cmd, "--log-level", self._log_level],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=ROOT,
                env=env,
            )
        self.base_url = f"http://127.0.0.1:{port}"
        try:
            self._wait_ready(ready, time.monotonic() + timeout)
        except BaseException:  # a failed start (or Ctrl-C) leaves no process and no directory behind
            self.stop()
            raise
        return self

    def _wait_ready(self, ready: str, deadline: float) -> None:
        assert self._proc is not None
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"the gateway exited ({self._proc.returncode}): {self.log()[-2000:]}")
            try:
                if httpx.get(f"{self.base_url}{ready}", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the gateway was not ready: {self.log()[-2000:]}")
            time.sleep(0.05)

    @property
    def pid(self) -> int:
        assert self._proc is not None, "not started"
        return self._proc.pid

    def cpu_seconds(self) -> float:
        """utime + stime of the whole process: the event loop, its encode worker and its event
        subscribers' threads."""
        return cpu_seconds(0, self.pid)

    def metric(self, name: str, **labels: str) -> float:
        """The sum of a metric's samples with these labels (`name` as exposed: `..._total` for a
        counter's count)."""
        text = httpx.get(f"{self.base_url}/metrics", timeout=10).text
        total = 0.0
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    total += s.value
        return total

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._temp is not None:
            self._temp.cleanup()
