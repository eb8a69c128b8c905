"""What the benchmark reads from /proc: a process's CPU time and run-queue wait (from the scheduler's
own accounting), its memory, and how busy each core was with processes that are not the benchmark's."""

from __future__ import annotations

import contextlib
import os
import resource
import time
from collections.abc import Iterator
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _schedstat(pid: int) -> tuple[float, float]:
    """(CPU seconds, seconds spent runnable but waiting for a core) summed over the process's threads,
    from the scheduler's own nanosecond accounting (utime/stime in /proc/PID/stat are sampled at the
    tick, which is coarse for a process that runs in sub-millisecond bursts)."""
    run = wait = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/schedstat") as f:
            fields = f.read().split()
            run += int(fields[0])
            wait += int(fields[1])
    return run / 1e9, wait / 1e9


def cpu_seconds(pid: int) -> float:
    """CPU time of a process (all its threads), in seconds."""
    try:
        return _schedstat(pid)[0]
    except OSError:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK


def wait_seconds(pid: int) -> float:
    try:
        return _schedstat(pid)[1]
    except OSError:
        return 0.0


def rss_mb(pid: int, key: str = "VmRSS") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(x) for x in f.read().split()]
    return out


class CpuMeter:
    """CPU seconds used by a set of processes between start() and stop()."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self._t0 = 0.0
        self._c0 = 0.0
        self.cpu = 0.0
        self.wall = 0.0

    def _now(self) -> float:
        return sum(cpu_seconds(p) for p in self.pids)

    def start(self) -> None:
        self._c0, self._t0 = self._now(), time.monotonic()

    def stop(self) -> None:
        self.cpu, self.wall = self._now() - self._c0, time.monotonic() - self._t0


def core_busy(core: str) -> float:
    """Busy seconds of one core since boot (user+nice+system+irq+softirq+steal)."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith(f"cpu{core} "):
                v = [int(x) for x in line.split()[1:]]
                return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / CLK_TCK
    return 0.0


class Noise:
    """Whether the machine was quiet: how long the gateway and the upstreams waited for their core
    (run-queue wait), and how busy each core was with processes that are not this benchmark's. On a
    shared machine those take the core (req/s and latency suffer) and its caches (CPU µs rise)."""

    def __init__(self, gw_core: str, load_core: str, gw_pids: list[int], load_pids: list[int]) -> None:
        self.gw_core, self.load_core = gw_core, load_core
        self.gw_pids, self.load_pids = gw_pids, load_pids

    def _ours(self, pids: list[int]) -> float:
        total = 0.0
        for pid in pids:
            with contextlib.suppress(OSError):
                total += cpu_seconds(pid)
        return total

    def _sample(self) -> tuple[float, ...]:
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        me = resource.getrusage(resource.RUSAGE_SELF)
        return (
            time.monotonic(),
            core_busy(self.gw_core),
            core_busy(self.load_core),
            self._ours(self.gw_pids),
            self._ours(self.load_pids) + kids.ru_utime + kids.ru_stime + me.ru_utime + me.ru_stime,
            sum(wait_seconds(p) for p in self.gw_pids),
            sum(wait_seconds(p) for p in self.load_pids),
        )

    @contextlib.contextmanager
    def measure(self, into: dict[str, Any]) -> Iterator[None]:
        t0, g0, l0, og0, ol0, wg0, wl0 = self._sample()
        yield
        t1, g1, l1, og1, ol1, wg1, wl1 = self._sample()
        wall = max(1e-9, t1 - t0)
        # Time the gateway (and the upstreams) were ready to run but waited for their core.
        into["runq_wait_gw"] = (wg1 - wg0) / wall
        into["runq_wait_load"] = (wl1 - wl0) / wall
        if self.gw_core == self.load_core:
            into["foreign_gw_core"] = into["foreign_load_core"] = max(0.0, (g1 - g0) - (og1 - og0) - (ol1 - ol0)) / wall
        else:
            into["foreign_gw_core"] = max(0.0, (g1 - g0) - (og1 - og0)) / wall
            into["foreign_load_core"] = max(0.0, (l1 - l0) - (ol1 - ol0)) / wall


# ---------------------------------------------------------------------------------------------- processes
