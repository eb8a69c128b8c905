"""What-if mode: N simulated backends in virtual time, for comparing routing policies without sockets.

Build requests, pick a policy, compare results; 500 requests on 4 backends take about 0.1 s::

    from engines.sim.model import SimParams
    from engines.sim.text import render_chat, tokenize
    from engines.sim.whatif import WhatIfRequest, least_running, most_cached, run_whatif

    params = SimParams.preset("seed")
    system = {"role": "system", "content": "You are terse. " * 200}
    reqs = [WhatIfRequest(arrival_s=i * 0.05, max_tokens=64,
                          prompt_ids=tokenize(render_chat([system, {"role": "user", "content": f"q{i}"}])))
            for i in range(500)]
    for policy in (least_running, most_cached):
        results = run_whatif([params] * 4, reqs, policy)
        print(policy.__name__, sum(r.ttft_s for r in results) / len(results))

A policy is ``policy(cores, seq) -> backend index``: it sees each backend's ``BatchCore`` (``running``,
``waiting``, ``kv_usage``, ``cached_prefix_tokens(seq.hashes)``) and the new request's ``SimSequence``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engines.sim.cache import block_hashes
from engines.sim.model import BatchCore, SimParams, SimSequence

Policy = Callable[[Sequence[BatchCore], SimSequence], int]


@dataclass(frozen=True)
class WhatIfRequest:
    arrival_s: float
    prompt_ids: Sequence[int]
    max_tokens: int


@dataclass
class WhatIfResult:
    request: WhatIfRequest
    backend: int
    seq: SimSequence
    first_token_s: float = math.nan
    finish_s: float = math.nan

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.request.arrival_s

    @property
    def tokens_per_s(self) -> float:
        """Output tokens per second of decode time (first token to last), the per-request view."""
        decode = self.finish_s - self.first_token_s
        return (self.seq.generated - 1) / decode if decode > 0 else math.nan


def least_running(cores: Sequence[BatchCore], seq: SimSequence) -> int:
    """Example policy: fewest running + waiting sequences, lowest index on ties."""
    return min(range(len(cores)), key=lambda i: (len(cores[i].running) + len(cores[i].waiting), i))


def most_cached(cores: Sequence[BatchCore], seq: SimSequence) -> int:
    """Example policy: the backend holding the longest cached prefix, then the least loaded.

    It has no load bound, so a hot prefix piles onto one backend: a what-if run shows why one is needed.
    """
    return min(
        range(len(cores)),
        key=lambda i: (-cores[i].cached_prefix_tokens(seq.hashes), len(cores[i].running), i),
    )


def run_whatif(backends: Sequence[SimParams], requests: Sequence[WhatIfRequest], policy: Policy) -> list[WhatIfResult]:
    """Simulate every request to completion; results come back in the order of ``requests``."""
    cores = [BatchCore(p) for p in backends]
    step_end: list[float | None] = [None] * len(cores)
    by_seq: dict[tuple[int, int], WhatIfResult] = {}
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
    slots: list[WhatIfResult | None] = [None] * len(requests)
    nxt = 0
    while nxt < len(order) or any(t is not None for t in step_end):
        arrival = requests[order[nxt]].arrival_s if nxt < len(order) else math.inf
        busy = [(t, i) for i, t in enumerate(step_end) if t is not None]
        step_t, b = min(busy) if busy else (math.inf, -1)
        if arrival <= step_t:
            req = requests[order[nxt]]
            seq = SimSequence(
                prompt_tokens=len(req.prompt_ids),
                max_tokens=req.max_tokens,
                hashes=block_hashes(req.prompt_ids, backends[0].block_size),
            )
            b = policy(cores, seq)
            if backends[b].block_size != backends[0].block_size:
                seq.hashes = block_hashes(req.prompt_ids, backends[b].block_size)
            cores[b].submit(seq)
            result = WhatIfResult(request=req, backend=b, seq=seq)
            slots[order[nxt]] = result
            by_seq[(b, seq.seq_id)] = result
            nxt += 1
            if step_end[b] is None:
                step_end[b] = arrival + cores[b].begin_step()
            continue
        for seq in cores[b].end_step():
            result = by_seq[(b, seq.seq_id)]
            if seq.generated == 1:
                result.first_token_s = step_t
            if seq.state == "finished":
                result.finish_s = step_t
        step_end[b] = step_t + cores[b].begin_step() if cores[b].has_work else None
    return [r for r in slots if r is not None]
