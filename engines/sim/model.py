"""The simulator's performance model: parameters and presets, and a continuous-batching core.

Pure and clock-free: ``BatchCore`` says how long each step takes; a driver (``sim_engine``) decides whether
that time passes for real (the HTTP server) or virtually (what-if comparisons). Its own ``clock`` is model
time, the sum of the steps' durations, which the latency histograms are measured in.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from engines.sim.cache import PrefixCache
from engines.sim.latency import LatencyStats

Flavour = Literal["vllm", "sglang", "llamacpp"]

# Seed calibration, measured on the real setup: 1 stream gets 11.3 tok/s, 32 streams get 5.6 tok/s each
# (179.9 tok/s aggregate). With step time t(b) = a + c*(b-1): t(1) = 1/11.3 and t(32) = 1/5.6.
_SEED_T1 = 1 / 11.3
_SEED_T32 = 1 / 5.6


@dataclass(frozen=True, kw_only=True)
class SimParams:
    """What one simulated backend is (flavour, model name) and how fast it is.

    Every field has a default (the ``fast`` preset's timing), so ``SimParams(flavour="llamacpp")`` works.
    """

    flavour: Flavour = "vllm"
    model: str = "tiny"
    base_step_s: float = 0.001  # decode step time at batch 1
    per_seq_step_s: float = 0.0001  # extra step time per extra running sequence
    prefill_tokens_per_s: float = 1_000_000.0
    max_batch: int = 64  # max running sequences
    kv_budget_tokens: int = 1_000_000  # running sequences' reservations (prompt+max output) must fit
    context_limit: int = 4096  # prompt + at least one output token must fit
    block_size: int = 16  # prefix-cache block size in tokens
    default_max_tokens: int = 16
    fault: str = ""  # default fault spec for every request (same grammar as the x-sim-fault header)

    def __post_init__(self) -> None:
        if self.flavour not in ("vllm", "sglang", "llamacpp"):
            raise ValueError(f"unknown sim flavour {self.flavour!r}")
        positive = (
            "base_step_s",
            "prefill_tokens_per_s",
            "max_batch",
            "kv_budget_tokens",
            "context_limit",
            "block_size",
            "default_max_tokens",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"SimParams.{name} must be > 0")
        if self.per_seq_step_s < 0:
            raise ValueError("SimParams.per_seq_step_s must be >= 0")

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> SimParams:
        """``seed`` (calibrated to the measured setup), ``fast`` (tests) or ``demo`` (visible streaming)."""
        presets: dict[str, dict[str, Any]] = {
            "fast": {},
            "demo": {
                "base_step_s": 0.02,
                "per_seq_step_s": 0.001,
                "prefill_tokens_per_s": 5000.0,
                "max_batch": 16,
                "kv_budget_tokens": 65536,
                "default_max_tokens": 64,
            },
            # Prefill speed and budgets were not measured; they are set so that short prompts barely
            # show and 32 streams of 1k-token requests fit, which is what the calibration run did.
            "seed": {
                "base_step_s": _SEED_T1,
                "per_seq_step_s": (_SEED_T32 - _SEED_T1) / 31,
                "prefill_tokens_per_s": 2000.0,
                "max_batch": 64,
                "kv_budget_tokens": 65536,
                "context_limit": 4096,
                "default_max_tokens": 64,
            },
        }
        if name not in presets:
            raise ValueError(f"unknown sim preset {name!r}; choose one of {sorted(presets)}")
        return dataclasses.replace(cls(), **{**presets[name], **overrides})

    def step_time(self, running: int) -> float:
        """Seconds one decode step takes with ``running`` sequences in the batch."""
        return self.base_step_s + self.per_seq_step_s * max(running - 1, 0)


@dataclass(eq=False)
class SimSequence:
    """One request inside the model. ``stop_after`` forces an early "stop" (the ``tokens=N`` fault)."""

    prompt_tokens: int
    max_tokens: int
    hashes: tuple[int, ...] = ()
    stop_after: int | None = None
    seq_id: int = 0  # set by BatchCore.submit
    state: Literal["waiting", "running", "finished", "aborted"] = "waiting"
    cached_tokens: int = 0
    generated: int = 0
    finish_reason: str | None = None
    arrived_at: float = 0.0  # model time (BatchCore.clock) of submission and of admission
    admitted_at: float = 0.0

    @property
    def target(self) -> int:
        """How many tokens this sequence will generate."""
        if self.stop_after is not None:
            return max(min(self.stop_after, self.max_tokens), 0)
        return self.max_tokens

    @property
    def reserved(self) -> int:
        """KV tokens reserved at admission: the prompt plus every token it may generate."""
        return self.prompt_tokens + self.target


@dataclass
class ModelCounters:
    """Monotonic totals, the raw material of each flavour's /metrics."""

    prompt_tokens: int = 0
    prefill_tokens: int = 0  # prompt tokens actually computed (not served from the cache)
    generation_tokens: int = 0
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_hits: int = 0  # of which were cached (= cached tokens)
    steps: int = 0
    busy_slot_steps: int = 0  # sum of batch sizes over steps (llama.cpp's busy slots per decode)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    max_seq_tokens: int = 0  # largest prompt + generated seen (llama.cpp's n_tokens_max)
    finished: dict[str, int] = field(default_factory=lambda: {"stop": 0, "length": 0, "abort": 0})
    latency: LatencyStats = field(default_factory=LatencyStats)


class BatchCore:
    """Continuous batching without a wall clock.

    Each step: admit waiting sequences FIFO while ``max_batch`` and the KV budget allow (admission
    reserves prompt + output tokens, so nothing is ever preempted; a lone sequence larger than the
    budget is still admitted so the queue cannot deadlock); prefill the admitted ones' uncached
    prompt tokens; then every running sequence gets one token. Drive it with ``begin_step()`` (returns
    the step's duration in seconds), let that time pass, then ``end_step()``.
    """

    def __init__(self, params: SimParams) -> None:
        self.params = params
        self.waiting: deque[SimSequence] = deque()
        self.running: list[SimSequence] = []
        self.cache = PrefixCache()
        self.counters = ModelCounters()
        self._reserved = 0
        self._ids = itertools.count(1)
        self.clock = 0.0  # model time: the sum of the steps' durations so far
        self._step_s = 0.0

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def kv_used_tokens(self) -> int:
        """Tokens actually held by running sequences (prompt + generated so far)."""
        return sum(s.prompt_tokens + s.generated for s in self.running)

    @property
    def kv_usage(self) -> float:
        return min(self.kv_used_tokens / self.params.kv_budget_tokens, 1.0)

    def cached_prefix_tokens(self, hashes: Sequence[int]) -> int:
        """Prompt tokens a request with these block hashes would find cached now (for routing policies)."""
        return self.cache.match(hashes) * self.params.block_size

    def submit(self, seq: SimSequence) -> None:
        seq.seq_id = next(self._ids)
        seq.state = "waiting"
        seq.arrived_at = self.clock
        self.waiting.append(seq)

    def abort(self, seq: SimSequence) -> bool:
        """Drop a waiting or running sequence at once; False if it had already finished."""
        if seq.state == "waiting":
            self.waiting.remove(seq)
        elif seq.state == "running":
            self.running.remove(seq)
            self._release(seq)
        else:
            return False
        seq.state = "aborted"
        seq.finish_reason = "abort"
        self.counters.finished["abort"] += 1
        return True

    def begin_step(self) -> float:
        """Admit what fits and return this step's duration (0.0 when there is nothing to run)."""
        prefill = 0
        budget = self.params.kv_budget_tokens
        while self.waiting and len(self.running) < self.params.max_batch:
            seq = self.waiting[0]
            if self.running and self._reserved + seq.reserved > budget:
                break  # FIFO: a big request at the head blocks the ones behind it, as in vLLM
            self.waiting.popleft()
            prefill += self._admit(seq)
        if not self.running:
            self._step_s = 0.0
            return 0.0
        decode = self.params.step_time(len(self.running))
        prefill_s = prefill / self.params.prefill_tokens_per_s
        self.counters.prefill_tokens += prefill
        self.counters.prefill_seconds += prefill_s
        self.counters.decode_seconds += decode
        self._step_s = decode + prefill_s
        return self._step_s

    def end_step(self) -> list[SimSequence]:
        """Give every running sequence one token; return them (finished ones have ``state == "finished"``)."""
        advanced = list(self.running)
        self.clock += self._step_s
        latency = self.counters.latency
        self.counters.steps += 1
        self.counters.busy_slot_steps += len(advanced)
        self.counters.generation_tokens += len(advanced)
        for seq in advanced:
            seq.generated += 1
            if seq.generated == 1:
                latency.ttft.observe(self.clock - seq.arrived_at)
            else:
                latency.inter_token.observe(self._step_s)
            self.counters.max_seq_tokens = max(self.counters.max_seq_tokens, seq.prompt_tokens + seq.generated)
            if seq.generated >= seq.target:
                seq.state = "finished"
                seq.finish_reason = "length" if seq.target >= seq.max_tokens else "stop"
                self.counters.finished[seq.finish_reason] += 1
                latency.e2e.observe(self.clock - seq.arrived_at)
                latency.queue.observe(seq.admitted_at - seq.arrived_at)
                self.running.remove(seq)
                self._release(seq)
        return advanced

    def _admit(self, seq: SimSequence) -> int:
        bs = self.params.block_size
        matched = self.cache.match(seq.hashes)
        if matched * bs >= seq.prompt_tokens and matched > 0:
            matched -= 1  # a fully cached prompt still recomputes its last block to get logits
        seq.cached_tokens = matched * bs
        self.cache.pin(seq.hashes)
        seq.state = "running"
        seq.admitted_at = self.clock
        self.running.append(seq)
        self._reserved += seq.reserved
        self.counters.prompt_tokens += seq.prompt_tokens
        self.counters.prefix_queries += seq.prompt_tokens
        self.counters.prefix_hits += seq.cached_tokens
        self._trim_cache()
        return seq.prompt_tokens - seq.cached_tokens

    def _release(self, seq: SimSequence) -> None:
        self._reserved -= seq.reserved
        self.cache.unpin(seq.hashes)
        self._trim_cache()

    def _trim_cache(self) -> None:
        # Unpinned cached blocks live in the KV space no running sequence has reserved.
        free = self.params.kv_budget_tokens - self._reserved
        self.cache.trim(free // self.params.block_size)
