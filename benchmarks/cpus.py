"""Give a CPU engine a core of its own, away from the client and the gateway that time it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.engines.servers import group_processes


def isolate_engine(*pgids: int, nice: int = 10) -> set[int]:
    """Move every thread of every process in each group of `pgids` (vLLM: API server, engine core,
    worker) to this process's first CPU at nice `nice`, and this process to its other CPUs; returns
    this process's CPUs before. All the engines in one call: a second call would find this process
    on the other CPUs already and put its engine there.

    vLLM's CPU build keeps its cores busy while it decodes. Sharing them, the client and the gateway
    get descheduled for tens to hundreds of milliseconds at a time (measured on a 2-vCPU VM: a
    process that only sleeps 5 ms in a loop overslept by 33 ms at p90 and 700 ms at most while 16
    streams ran), and that wait lands in their timings, the client's more than the gateway's. Giving
    the engine its own core is the nearest thing to the usual deployment, where the engine has its
    own machine. Processes started later from here (the gateway, Prometheus) inherit the rest."""
    cpus = os.sched_getaffinity(0)
    if len(cpus) < 2:
        return cpus
    engine_cpu = min(cpus)
    for proc in (p for pgid in pgids for p in group_processes(pgid)):
        try:
            for task in (proc / "task").iterdir():
                tid = int(task.name)
                os.sched_setaffinity(tid, {engine_cpu})
                os.setpriority(os.PRIO_PROCESS, tid, nice)
        except OSError:
            continue
    os.sched_setaffinity(0, cpus - {engine_cpu})
    return cpus
