"""Start, pin, prioritise and stop the benchmark's long-running processes (nginx, the paced upstream,
the gateway), each with its output in a log file in the run's temporary folder."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, n: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        return ""


@dataclass
class Env:
    tmp: Path
    gw_core: str
    load_core: str
    nice: int = 0
    procs: list[Proc] = field(default_factory=list)

    def start(self, name: str, argv: list[str], core: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> Proc:
        log = self.tmp / f"{name}.log"
        # taskset execs the command, so the Popen pid is the pinned process itself.
        popen = subprocess.Popen(
            ["taskset", "-c", core, *argv],
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
        if self.nice:
            set_nice(popen.pid, self.nice)
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def stop(self, proc: Proc) -> None:
        if proc.alive():
            proc.popen.send_signal(signal.SIGTERM)
            try:
                proc.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait(timeout=5)
        if proc in self.procs:
            self.procs.remove(proc)

    def stop_all(self) -> None:
        for proc in reversed(list(self.procs)):
            self.stop(proc)


def set_nice(pid: int, nice: int) -> None:
    """The process's nice value, and its autogroup's: with sched_autogroup_enabled (the default on most
    distributions) the scheduler first shares a core between sessions, so a process's own nice value
    only counts against processes of its own session."""
    os.setpriority(os.PRIO_PROCESS, pid, nice)
    with contextlib.suppress(OSError), open(f"/proc/{pid}/autogroup", "w") as f:
        f.write(str(nice))


def own_autogroup_nice() -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/self/autogroup") as f:
        return int(f.read().split("nice")[1])
    return None


def restore_autogroup_nice(nice: int) -> None:
    with contextlib.suppress(OSError), open("/proc/self/autogroup", "w") as f:
        f.write(str(nice))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, proc: Proc, timeout_s: float = 30.0, want: int = 200) -> None:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        if not proc.alive():
            raise SystemExit(f"{proc.name} exited:\n{proc.tail()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == want:
                    return
                last = str(resp.status)
        except urllib.error.HTTPError as exc:
            last = str(exc.code)
        except OSError as exc:
            last = str(exc)
        time.sleep(0.1)
    raise SystemExit(f"{proc.name} not ready at {url} after {timeout_s}s ({last}):\n{proc.tail()}")


# ---------------------------------------------------------------------------------------------- config
