"""Prefix-cache hit rate of the gateway's `prefix_affinity` and `kv_events` balancers against
`round_robin` and an oracle, on two REAL vLLM CPU replicas with prefix caching
(docs/routing-benchmark.md).

    python benchmarks/affinity.py [--conversations 25] [--turns 4]
    python benchmarks/affinity.py --policies round_robin,prefix_affinity,kv_events,oracle \
        --concurrency 8,32 --gateways 2 --skew zipf --json FILE

`--gateways N` puts N gateways (same config, each its own process as `gateway serve` runs it, its
own routing memory and its own KV-event subscriptions) over the same replicas, the client
alternating between them request by request.
`--repeat R` runs every policy R times at each concurrency, the order rotated each time, and a row
pools them (TTFT quantiles over every repeat's requests, each repeat's p90 kept). Before each
concurrency's runs an unmeasured pass of the workload goes straight to the replicas (`--no-warmup`:
none): an engine's first batches of a size are slow, and without it the first policy paid for them.
`--skew zipf` draws `--requests` requests (default 8 x conversations) from the conversations with
weight 1/rank^s (`--zipf-s`, default 1) with scripted assistant turns (Workload.skew). Both
replicas always publish KV events (`--kv-events-config`), so every policy runs on the same engines.
Requests stream, for TTFT; `--json FILE` gets one row per policy and concurrency (policy,
concurrency, hit_rate, ratio_to_oracle, max_mean_inflight, ttft_p50_s, ttft_p90_s, and the raw
counts), and a record goes to benchmarks/results/ (`--no-record`: none). `--trace FILE` writes every
request's conversation, turn, replica, cached tokens and the balancer's explanation, per policy.

What follows describes the default workload (`--skew none`).

Workload: N multi-turn conversations. Each opens with a shared system prompt and a conversation-own
preamble (~440 tokens in all), and each turn appends the previous answer (max_tokens, ignore_eos) and
a short user message (~70 tokens a turn; ~650 tokens at turn 4). They are sent interleaved: turn t of
every conversation, then turn t+1, each turn by `c` workers in conversation order. Each policy runs
once at every concurrency in `--concurrency` (default 1 and 8): at 1 the hit rate counts placement
alone; at 8 the load bound and the in-flight balance come into play.

Setup: two replicas, one core each: all of a replica's processes (API server, engine core, worker)
confined to its core with taskset, its worker's threads bound there (VLLM_CPU_OMP_THREADS_BIND=0 and
=1). Without the taskset (`--no-pin`) the two engine cores and API servers, which poll, float onto
one core and starve that replica's worker: the same replica then served requests up to 5x slower
than the other under round_robin, and every timing and in-flight figure measured that instead of
the policy. Each replica has a KV budget of
`--kv-tokens` (default 8,192 tokens, ~0.6x the workload's distinct prefix tokens: short of the whole
workload, enough for half of it); the oracle is ONE replica with both budgets together. The pair runs
behind the gateway once with `prefix_affinity` and once with `round_robin`, with the prefix cache
reset in between (vLLM's dev-mode POST /reset_prefix_cache); the oracle is sent the same workload
directly.

Hit rate = delta vllm:prefix_cache_hits_total / delta vllm:prefix_cache_queries_total summed over the
replicas (cross-checked against the responses' usage.prompt_tokens_details.cached_tokens). In-flight
balance = each replica's time-averaged count of requests in flight, from the client's own send and
finish times and the replica each response names (x-gateway-backend): max over replicas / mean. Targets:
prefix_affinity >= 0.9 x oracle, >= 2 x round_robin, and max/mean in-flight <= 1.3 (at c > 1);
where kv_events runs, its own instead: >= 0.95 x oracle, max/mean in-flight <= 1.2, TTFT p90 below
prefix_affinity's. Exit status 1 when one is missed.
Method, figures and what they mean: docs/routing-benchmark.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout: the engine launcher lives in tests/

from benchmarks import record  # noqa: E402
from benchmarks.gateway_process import GatewayProcess, cpu_seconds  # noqa: E402
from gateway.config import SharedPrefixConfig  # noqa: E402
from gateway.policy.kv import kv_spec_from_hf_config  # noqa: E402
from gateway.policy.prefix import canonical_prompt  # noqa: E402
from gateway.tools.hfconfig import load_hf_config  # noqa: E402
from tests.engines import servers  # noqa: E402
from tests.engines.tiny_vocab import CORPUS  # noqa: E402
from tests.integration.gateway_harness import engine_metric  # noqa: E402

MODEL = servers.MODEL_NAME
HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"
WORDS = CORPUS.split()  # the tiny model's BPE was trained on CORPUS: ~2.8 characters a token
TARGET_VS_ORACLE = 0.9
TARGET_VS_ROUND_ROBIN = 2.0
TARGET_IMBALANCE = 1.3
TARGET_KV_VS_ORACLE = 0.95
TARGET_KV_IMBALANCE = 1.2


# ---------------------------------------------------------------------------------------------- workload
@dataclass(frozen=True)
class Workload:
    conversations: int = 25
    turns: int = 4
    system_chars: int = 270
    """Shared by every conversation; ~100 tokens, so it does not fill one 128-token vLLM block."""
    preamble_chars: int = 850
    """Per conversation, ~310 tokens; turn 1 is ~440 tokens with the system prompt and the template."""
    turn_chars: int = 80
    """Each later user message; with the previous answer and the template, ~70 tokens a turn."""
    max_tokens: int = 16
    seed: int = 4
    skew: str = "none"
    """`none`: every conversation runs `turns` turns, each turn waiting for the model's previous
    answer. `zipf`: `requests` requests, each drawn from the conversations with probability
    1/rank^zipf_s; the assistant turns are scripted (so every policy is sent the same prompts
    whatever the timing), and one conversation's requests may overlap."""
    zipf_s: float = 1.0
    requests: int = 0
    """zipf: requests in all (0: 8 x conversations)."""
    reply_chars: int = 80
    """zipf: each scripted assistant turn."""


def _text(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(WORDS)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)


def system_prompt(w: Workload) -> str:
    head = "You are an agent behind an inference gateway. "
    return head + _text(random.Random(f"{w.seed}-system"), w.system_chars - len(head))


def opening(w: Workload, conv: int) -> list[dict[str, str]]:
    rng = random.Random(f"{w.seed}-conv-{conv}")
    return [
        {"role": "system", "content": system_prompt(w)},
        {"role": "user", "content": f"Conversation {conv:03d}. " + _text(rng, w.preamble_chars - 18)},
    ]


def follow_up(w: Workload, conv: int, turn: int) -> dict[str, str]:
    rng = random.Random(f"{w.seed}-conv-{conv}-turn-{turn}")
    return {"role": "user", "content": f"Turn {turn} of {conv:03d}: " + _text(rng, w.turn_chars - 16)}


def scripted_reply(w: Workload, conv: int, turn: int) -> dict[str, str]:
    rng = random.Random(f"{w.seed}-conv-{conv}-reply-{turn}")
    return {"role": "assistant", "content": _text(rng, w.reply_chars)}


def scripted_turn(w: Workload, conv: int, turn: int) -> list[dict[str, str]]:
    """The messages of a conversation's turn `turn` (0-based) with scripted assistant turns: every
    earlier turn's messages, then its own user message."""
    messages = opening(w, conv)
    for t in range(1, turn + 1):
        messages += [scripted_reply(w, conv, t), follow_up(w, conv, t + 1)]
    return messages


def zipf_schedule(w: Workload) -> list[tuple[int, int]]:
    """(conversation, turn) per request: conversation k (rank k+1) drawn with weight 1/(k+1)^s; its
    n-th request is its turn n mod `turns`, so a popular conversation's turns repeat (several users
    walking the same session) and its prompts stay within max_model_len."""
    rng = random.Random(f"{w.seed}-zipf")
    weights = [1.0 / (k + 1) ** w.zipf_s for k in range(w.conversations)]
    seen: Counter[int] = Counter()
    out = []
    for conv in rng.choices(range(w.conversations), weights, k=w.requests or 8 * w.conversations):
        out.append((conv, seen[conv] % w.turns))
        seen[conv] += 1
    return out


# ---------------------------------------------------------------------------------------------- results
@dataclass
class RunResult:
    label: str
    hits: float = 0.0
    queries: float = 0.0
    usage_cached: int = 0
    usage_prompt: int = 0
    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    per_backend: dict[str, int] = field(default_factory=dict)
    mean_in_flight: dict[str, float] = field(default_factory=dict)
    peak_in_flight: dict[str, int] = field(default_factory=dict)
    final_prompt_tokens: list[int] = field(default_factory=list)
    """usage.prompt_tokens of each conversation's last turn."""
    switches: int = 0
    """Turns sent to a different backend than the conversation's previous turn."""
    conversations_per_backend: dict[str, int] = field(default_factory=dict)
    """Where each conversation's last turn went."""
    ttft_s: list[float] = field(default_factory=list)
    """Time to the first streamed chunk of each request, as the client saw it."""
    trace: list[dict[str, Any]] = field(default_factory=list)
    """Per request, in completion order: conversation, turn, backend, x-gateway-balancer, prompt and
    cached tokens (`--trace FILE` writes them)."""
    reasons: dict[str, int] = field(default_factory=dict)
    """The balancer's reasons (x-gateway-balancer's second word: sticky, spill, hash...), counted."""
    gateways: int = 1
    gateway_cpu_ms: float | None = None
    """CPU time of the gateways' processes per request (ms): every thread's, the relay, routing,
    the match's encodes and tokenize calls and the KV events' decoding included."""

    forgone_blocks: int = 0
    """kv_events: blocks the longest holder had beyond the chosen backend, summed over the requests
    (x-gateway-balancer's `blocks`): the hits a spill gave up at decision time."""
    predicted_cached: float | None = None
    served_cached: float | None = None
    """kv_events: the prompt tokens the gateways' indexes predicted cached on the backend they chose,
    and what the engines reported serving from cache for the same requests (gateway metrics)."""
    tokenize_p50_s: float | None = None
    tokenize_p90_s: float | None = None
    """A /tokenize round trip to the replicas (what the kv_events match asks of an engine), sampled
    every 0.1 s during the run, whatever the policy."""
    prompt_ids: dict[str, float] = field(default_factory=dict)
    """kv_events: where the requests' ids for the match came from (gateway_kv_events_prompt_ids_total)."""
    event_batches: int = 0
    events: int = 0
    """kv_events: the KV-event batches and events the gateways applied during the run, summed over
    the gateways (each hears every engine): the decoding work behind the gateway CPU figure."""
    ttft_p90_runs_s: list[float] = field(default_factory=list)
    """With --repeat: each repeat's own TTFT p90 (the row's figures pool every repeat's requests)."""

    def ttft(self, q: float) -> float | None:
        if not self.ttft_s:
            return None
        ordered = sorted(self.ttft_s)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    @property
    def imbalance(self) -> float | None:
        """max / mean of the replicas' time-averaged in-flight counts (None: no gateway ran)."""
        values = list(self.mean_in_flight.values())
        if len(values) < 2 or not sum(values):
            return None
        return max(values) / (sum(values) / len(values))


def in_flight(
    spans: Sequence[tuple[str, float, float]], names: Sequence[str], seconds: float
) -> tuple[dict[str, float], dict[str, int]]:
    """Each backend's time-averaged and peak count of requests in flight, from the client's own
    (backend, sent, finished) spans: exact, with no sampler in the run to miss a short peak or to
    take CPU from the processes measured."""
    means = {n: sum(end - start for b, start, end in spans if b == n) / seconds if seconds > 0 else 0.0 for n in names}
    peaks: dict[str, int] = {}
    for n in names:
        edges = sorted([(start, 1) for b, start, _ in spans if b == n] + [(end, -1) for b, _, end in spans if b == n])
        now = peak = 0
        for _, step in edges:  # at a tie the end (-1) sorts first: a request that ends as one starts
            now += step
            peak = max(peak, now)
        peaks[n] = peak
    return means, peaks


SUMMED = (
    "hits",
    "queries",
    "usage_cached",
    "usage_prompt",
    "requests",
    "errors",
    "seconds",
    "switches",
    "forgone_blocks",
    "event_batches",
    "events",
)
"""The RunResult counts that a policy's repeats add up to."""


def pooled(runs: Sequence[RunResult]) -> RunResult:
    """One row from a policy's repeats: counts summed, TTFTs and traces pooled (each trace entry
    tagged with its repeat), in-flight means averaged and peaks maxed, CPU per request averaged;
    each repeat's own TTFT p90 kept, for the noise."""
    if len(runs) == 1:
        return runs[0]
    out = RunResult(runs[0].label, gateways=runs[0].gateways)
    for n, r in enumerate(runs):
        for name in SUMMED:
            setattr(out, name, getattr(out, name) + getattr(r, name))
        out.ttft_s += r.ttft_s
        out.trace += [{**t, "repeat": n} for t in r.trace]
        out.final_prompt_tokens = r.final_prompt_tokens
        out.conversations_per_backend = r.conversations_per_backend
        for into, add in ((out.per_backend, r.per_backend), (out.reasons, r.reasons), (out.prompt_ids, r.prompt_ids)):
            for k, v in add.items():
                into[k] = into.get(k, 0) + v  # type: ignore[assignment]
        for k, v in r.peak_in_flight.items():
            out.peak_in_flight[k] = max(out.peak_in_flight.get(k, 0), v)
        p90 = r.ttft(0.9)
        if p90 is not None:
            out.ttft_p90_runs_s.append(p90)
    out.mean_in_flight = {
        k: sum(r.mean_in_flight.get(k, 0.0) for r in runs) / len(runs) for k in runs[0].mean_in_flight
    }
    cpu = [r.gateway_cpu_ms for r in runs if r.gateway_cpu_ms is not None]
    out.gateway_cpu_ms = sum(cpu) / len(cpu) if cpu else None
    if all(r.predicted_cached is not None and r.served_cached is not None for r in runs):
        out.predicted_cached = sum(r.predicted_cached or 0.0 for r in runs)
        out.served_cached = sum(r.served_cached or 0.0 for r in runs)
    tok50 = sorted(r.tokenize_p50_s for r in runs if r.tokenize_p50_s is not None)
    tok90 = sorted(r.tokenize_p90_s for r in runs if r.tokenize_p90_s is not None)
    out.tokenize_p50_s = tok50[len(tok50) // 2] if tok50 else None
    out.tokenize_p90_s = tok90[len(tok90) // 2] if tok90 else None
    return out


class TokenizeProbe:
    """Times a POST /tokenize (the kv_events match's call) to each replica in turn every `interval` s
    while a run goes: what the match's round trip costs under that run's load."""

    def __init__(self, base_urls: Sequence[str], messages: list[dict[str, str]], interval: float = 0.1) -> None:
        self._urls = base_urls
        self._body = {"model": MODEL, "messages": messages}
        self._interval = interval
        self._stop = threading.Event()
        self.times: list[float] = []
        self._thread = threading.Thread(target=self._run, name="tokenize-probe", daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            n = 0
            while not self._stop.is_set():
                start = time.perf_counter()
                r = client.post(f"{self._urls[n % len(self._urls)]}/tokenize", json=self._body)
                if r.status_code == 200:
                    self.times.append(time.perf_counter() - start)
                n += 1
                self._stop.wait(self._interval)

    def __enter__(self) -> TokenizeProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=35)

    def quantile(self, q: float) -> float | None:
        ordered = sorted(self.times)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None


def prefix_counters(metrics_urls: Sequence[str]) -> tuple[float, float]:
    return (sum(engine_metric(u, HITS) for u in metrics_urls), sum(engine_metric(u, QUERIES) for u in metrics_urls))


@dataclass
class Reply:
    status: int
    headers: httpx.Headers
    content: str
    usage: dict[str, Any]
    ttft_s: float | None
    text: str = ""


def forgone(explanation: str, backend: str) -> int:
    """From `kv_events REASON PICK; blocks r0:3,r1:0 of 5; load ...`: the longest holder's blocks
    less the chosen backend's (0 when the header says nothing)."""
    _, found, rest = explanation.partition("; blocks ")
    if not found:
        return 0
    matched = dict(part.split(":") for part in rest.split(" of ")[0].split(","))
    return max(int(v) for v in matched.values()) - int(matched.get(backend, 0))


def send(client: httpx.Client, url: str, body: dict[str, Any]) -> Reply:
    """POST a streamed chat request; the time to its first chunk (the first token), its text, its usage."""
    streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    with client.stream("POST", f"{url}/chat/completions", json=streamed) as r:
        if r.status_code != 200:
            return Reply(r.status_code, r.headers, "", {}, None, r.read().decode(errors="replace"))
        ttft, parts, usage = None, [], {}
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices"):
                if ttft is None:
                    ttft = time.perf_counter() - start
                parts += [(c.get("delta") or {}).get("content") or "" for c in chunk["choices"]]
            if chunk.get("usage"):
                usage = chunk["usage"]
        return Reply(200, r.headers, "".join(parts), usage, ttft)


def drive(
    label: str,
    v1_urls: Sequence[str],
    engine_metrics_urls: Sequence[str],
    w: Workload,
    concurrency: int,
    backend_names: Sequence[str] = (),
    timeout: float = 300.0,
) -> RunResult:
    """Send the workload with `concurrency` workers, request i to `v1_urls[i % len]`, and measure.
    skew none: interleaved turns (turn t of every conversation, then turn t+1), each turn carrying
    the model's previous answer; zipf: the schedule's requests in order, scripted assistant turns."""
    result = RunResult(label, gateways=len(v1_urls))
    hits0, queries0 = prefix_counters(engine_metrics_urls)
    convs = [opening(w, c) for c in range(w.conversations)]
    last_backend: dict[int, str] = {}
    lock = threading.Lock()
    sent = iter(range(1 << 62))
    zipf = w.skew == "zipf"
    last_turn = w.turns - 1
    spans: list[tuple[str, float, float]] = []

    def one(client: httpx.Client, conv: int, turn: int, index: int = 0) -> None:
        messages = scripted_turn(w, conv, turn) if zipf else convs[conv]
        body = {"model": MODEL, "messages": messages, "max_tokens": w.max_tokens, "ignore_eos": True}
        with lock:
            url = v1_urls[next(sent) % len(v1_urls)]
        sent_at = time.monotonic()
        r = send(client, url, body)
        finished = time.monotonic()
        with lock:
            result.requests += 1
            if r.status != 200:
                result.errors += 1
                raise RuntimeError(f"{label}: conversation {conv} turn {turn}: HTTP {r.status} {r.text[:300]}")
            usage = r.usage
            result.usage_prompt += usage.get("prompt_tokens") or 0
            result.usage_cached += (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            if r.ttft_s is not None:
                result.ttft_s.append(r.ttft_s)
            explanation = r.headers.get("x-gateway-balancer", "")
            why = explanation.split(" ")
            if len(why) > 1:
                result.reasons[why[1]] = result.reasons.get(why[1], 0) + 1
            backend = r.headers.get("x-gateway-backend", "direct")
            spans.append((backend, sent_at, finished))
            result.forgone_blocks += forgone(explanation, backend)
            result.per_backend[backend] = result.per_backend.get(backend, 0) + 1
            result.trace.append(
                {
                    "index": index,
                    "conversation": conv,
                    "turn": turn,
                    "backend": backend,
                    "balancer": explanation,
                    "ttft_s": r.ttft_s,
                    "prompt_tokens": usage.get("prompt_tokens") or 0,
                    "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
                }
            )
            if conv in last_backend and last_backend[conv] != backend:
                result.switches += 1
            last_backend[conv] = backend
            if turn == last_turn and not zipf:
                result.final_prompt_tokens.append(usage.get("prompt_tokens") or 0)
        if turn < last_turn and not zipf:
            convs[conv].append({"role": "assistant", "content": r.content})
            convs[conv].append(follow_up(w, conv, turn + 2))

    start = time.monotonic()
    limits = httpx.Limits(max_connections=concurrency)
    with httpx.Client(timeout=timeout, limits=limits) as client, ThreadPoolExecutor(concurrency) as pool:
        if zipf:
            for f in [pool.submit(one, client, c, t, i) for i, (c, t) in enumerate(zipf_schedule(w))]:
                f.result()
        else:
            for turn in range(w.turns):  # interleaved: turn t of every conversation, then turn t+1
                for f in [pool.submit(one, client, c, turn) for c in range(w.conversations)]:
                    f.result()
    result.seconds = time.monotonic() - start
    result.conversations_per_backend = dict(Counter(last_backend.values()))
    if backend_names:
        result.mean_in_flight, result.peak_in_flight = in_flight(spans, backend_names, result.seconds)
    # vLLM's counters trail the responses by an engine step: wait until they account for every prompt.
    deadline = time.monotonic() + 15
    while True:
        hits1, queries1 = prefix_counters(engine_metrics_urls)
        if queries1 - queries0 >= result.usage_prompt or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    result.hits, result.queries = hits1 - hits0, queries1 - queries0
    return result


# ---------------------------------------------------------------------------------------------- replicas


def gateway_config(
    balancer: str,
    backends: Sequence[tuple[str, str]],
    epsilon: float | None = None,
    events: Sequence[tuple[int, int]] = (),
    slack: int | None = None,
    tokenizer: str | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One pool of the given (name, base_url) vLLM backends behind the route `tiny`; `events` the
    backends' (PUB, replay) ports, which a kv_events pool subscribes to; `tokenizer` the model's
    files, with which a kv_events pool encodes prompts itself."""
    entries: list[dict[str, Any]] = [{"name": n, "url": u, "model": MODEL} for n, u in backends]
    if balancer == "kv_events":
        for entry, (pub, replay) in zip(entries, events, strict=True):
            entry["kv_events"] = {
                "endpoint": f"tcp://127.0.0.1:{pub}",
                "replay_endpoint": f"tcp://127.0.0.1:{replay}",
                "topic": "kv",
            }
    pool: dict[str, Any] = {"engine": "vllm", "balancer": balancer, "backends": entries}
    if epsilon is not None:
        pool["kv_epsilon" if balancer == "kv_events" else "affinity_epsilon"] = epsilon
    if slack is not None:
        pool["kv_slack" if balancer == "kv_events" else "affinity_slack"] = slack
    if tokenizer is not None and balancer == "kv_events":
        pool["tokenizer"] = tokenizer
    pool.update(extra or {})
    return {
        "health": {"interval_s": 2, "scrape_interval_s": 1},
        "routing": {"platform": "nvidia_gpu"},  # vLLM's host, whatever machine runs the benchmark
        "pools": {"vllm": pool},
        "routes": [{"model": MODEL, "pools": ["vllm"]}],
    }


def reset_prefix_cache(base_url: str) -> None:
    """Empty a replica's prefix cache (needs VLLM_SERVER_DEV_MODE=1 at launch)."""
    r = httpx.post(f"{base_url}/reset_prefix_cache", timeout=30)
    r.raise_for_status()


def kv_cache_info(metrics_url: str) -> dict[str, str]:
    """The labels of vLLM's cache_config_info (block_size, num_gpu_blocks, kv_cache_size_tokens...)."""
    text = httpx.get(metrics_url, timeout=5).text
    for line in text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            inner = line[line.index("{") + 1 : line.rindex("}")]
            return dict((k, v.strip('"')) for k, _, v in (p.partition("=") for p in inner.split('",')))
    return {}


def run_gateway_policy(
    balancer: str,
    pair: Sequence[Any],
    w: Workload,
    concurrency: int,
    epsilon: float | None = None,
    gateways: int = 1,
    events: Sequence[tuple[int, int]] = (),
    slack: int | None = None,
    tokenizer: str | None = None,
    extra: dict[str, Any] | None = None,
) -> RunResult:
    """`gateways` gateway replicas with the same config over the same engines, the client alternating
    between them; each learns (prefix_affinity) or subscribes (kv_events) on its own.

    The gateways start before the caches are reset (a kv_events gateway replays what each engine
    buffered when it connects), and each engine is then sent one request of its own (a few tokens,
    less than a block: nothing the workload can hit), whatever the policy: the engine publishes its
    events at its next step, so a kv_events gateway hears the reset then, before the run, as a
    gateway that has been running would."""
    names = [f"r{i}" for i in range(len(pair))]
    backends = list(zip(names, [s.base_url for s in pair], strict=True))
    data = gateway_config(balancer, backends, epsilon, events, slack, tokenizer, extra)
    started: list[GatewayProcess] = []
    try:
        for _ in range(gateways):
            started.append(GatewayProcess(data).start())
        deadline = time.monotonic() + 30
        while not all(gw.metric("gateway_backend_up", backend=n) == 1 for gw in started for n in names):
            if time.monotonic() > deadline:
                raise RuntimeError("a gateway did not see every replica healthy")
            time.sleep(0.05)
        heard = [[gw.metric("gateway_kv_events_batches_total", backend=n) for n in names] for gw in started]
        for s in pair:
            reset_prefix_cache(s.base_url)
            poke = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
            httpx.post(f"{s.v1_url}/chat/completions", json=poke, timeout=30).raise_for_status()
        if balancer == "kv_events":
            caught_up(started, names, heard, deadline=time.monotonic() + 30)
        urls = [gw.base_url + "/v1" for gw in started]
        batches0 = sum(gw.metric("gateway_kv_events_batches_total") for gw in started)
        events0 = sum(gw.metric("gateway_kv_events_events_total") for gw in started)
        cpu0 = sum(gw.cpu_seconds() for gw in started)
        with TokenizeProbe([s.base_url for s in pair], opening(w, 0)) as tokenize:
            r = drive(balancer, urls, [s.metrics_url for s in pair], w, concurrency, names)
        r.gateway_cpu_ms = (sum(gw.cpu_seconds() for gw in started) - cpu0) * 1000 / max(r.requests, 1)
        settled(started)
        r.event_batches = int(sum(gw.metric("gateway_kv_events_batches_total") for gw in started) - batches0)
        r.events = int(sum(gw.metric("gateway_kv_events_events_total") for gw in started) - events0)
        r.tokenize_p50_s, r.tokenize_p90_s = tokenize.quantile(0.5), tokenize.quantile(0.9)
        if balancer == "kv_events":
            r.prompt_ids = {
                source: sum(gw.metric("gateway_kv_events_prompt_ids_total", source=source) for gw in started)
                for source in ("local", "resumed", "remembered", "prefix", "none", "mismatch", "resume_mismatch")
            }
            r.predicted_cached = sum(gw.metric("gateway_kv_events_predicted_cached_tokens_total") for gw in started)
            r.served_cached = sum(gw.metric("gateway_kv_events_served_cached_tokens_total") for gw in started)
        r.per_backend = {n: r.per_backend.get(n, 0) for n in names}  # a replica that got nothing shows 0
        r.conversations_per_backend = {n: r.conversations_per_backend.get(n, 0) for n in names}
        return r
    finally:
        for gw in started:
            gw.stop()


def settled(gateways: Sequence[GatewayProcess], timeout: float = 10.0) -> None:
    """Wait until no gateway has a request in flight: a request is accounted (its prompt ids, its
    predicted and served tokens) just after the client has its last byte."""
    deadline = time.monotonic() + timeout
    while any(gw.metric("gateway_requests_in_flight") for gw in gateways) and time.monotonic() < deadline:
        time.sleep(0.05)


def caught_up(
    gateways: Sequence[GatewayProcess], names: Sequence[str], heard: Sequence[Sequence[float]], deadline: float
) -> None:
    """Wait until every gateway has applied a KV-event batch from every engine since `heard` (its
    batch counts before the caches were reset), and its counts have settled: a subscriber replays
    what its engine buffered before it connected (the earlier runs' events: applying them is work
    that belongs before the run, not in its first requests' time to first token) before it applies
    a newer batch."""
    last: list[list[float]] = []
    while True:
        now = [[gw.metric("gateway_kv_events_batches_total", backend=n) for n in names] for gw in gateways]
        fresh = all(a > b for row, before in zip(now, heard, strict=True) for a, b in zip(row, before, strict=True))
        if fresh and now == last:
            return
        if time.monotonic() > deadline:
            raise RuntimeError("a gateway's KV-event subscriber heard nothing from its engine")
        last = now
        time.sleep(0.2)


@contextlib.contextmanager
def replicas(specs: Sequence[dict[str, Any]]) -> Iterator[list[Any]]:
    """Start vLLM replicas concurrently (one thread each); stop them all on exit."""
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # for POST /reset_prefix_cache
    started: list[Any] = []
    try:
        with ThreadPoolExecutor(len(specs)) as pool:
            futures = [pool.submit(servers.start_vllm, **spec) for spec in specs]
            errors = []
            for f in futures:
                try:
                    started.append(f.result())
                except Exception as exc:  # stop the others, then report
                    errors.append(exc)
            if errors:
                raise errors[0]
        yield started
    finally:
        for s in started:
            s.stop()


# ---------------------------------------------------------------------------------------------- report
ORACLE = "oracle"


def _ratio(results: dict[tuple[str, int], RunResult], label: str, conc: int) -> float | None:
    oracle = results.get((ORACLE, conc))
    r = results[(label, conc)]
    return r.hit_rate / oracle.hit_rate if oracle and oracle.hit_rate else None


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(results: dict[tuple[str, int], RunResult]) -> str:
    rows = [
        "| policy | concurrency | hit rate | ratio to oracle | max/mean in-flight | peak in-flight "
        "| TTFT p50 s | TTFT p90 s (each repeat's) | requests per replica | max/mean requests | balancer reasons "
        "| turns that changed replica | predicted / served cached tokens | gateway CPU ms/request "
        "| /tokenize under load p50 / p90 ms | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (label, conc), r in results.items():
        peaks = " / ".join(str(v) for v in r.peak_in_flight.values()) or "-"
        per = " / ".join(str(v) for _, v in sorted(r.per_backend.items()))
        share = f"{max(r.per_backend.values()) * 2 / r.requests:.2f}" if label != ORACLE and r.requests else "-"
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(r.reasons.items())) or "-"
        name = "oracle (1 replica, 2x KV)" if label == ORACLE else label
        predicted = "-"
        if r.predicted_cached is not None and r.served_cached is not None:
            predicted = f"{r.predicted_cached:.0f} / {r.served_cached:.0f} ({r.forgone_blocks} blocks forgone)"
        spread = ""
        if r.ttft_p90_runs_s:
            spread = f" ({min(r.ttft_p90_runs_s):.3f} to {max(r.ttft_p90_runs_s):.3f})"
        tokenize = "-"
        if r.tokenize_p50_s is not None and r.tokenize_p90_s is not None:
            tokenize = f"{r.tokenize_p50_s * 1000:.1f} / {r.tokenize_p90_s * 1000:.1f}"
        rows.append(
            f"| {name} | {conc} | {r.hit_rate:.3f} | {_fmt(_ratio(results, label, conc), '.2f')} "
            f"| {_fmt(r.imbalance, '.2f')} | {peaks} | {_fmt(r.ttft(0.5), '.3f')} | {_fmt(r.ttft(0.9), '.3f')}{spread} "
            f"| {per} | {share} | {reasons} | {r.switches} | {predicted} | {_fmt(r.gateway_cpu_ms, '.2f')} "
            f"| {tokenize} | {r.seconds:.1f} |"
        )
    return "\n".join(rows)


def rows(results: dict[tuple[str, int], RunResult]) -> list[dict[str, Any]]:
    """The --json file: one row per (policy, concurrency)."""
    out = []
    for (label, conc), r in results.items():
        raw = asdict(r)
        raw.pop("ttft_s")
        raw.pop("trace")
        out.append(
            {
                "policy": label,
                "concurrency": conc,
                "hit_rate": r.hit_rate,
                "ratio_to_oracle": _ratio(results, label, conc),
                "max_mean_inflight": r.imbalance,
                "ttft_p50_s": r.ttft(0.5),
                "ttft_p90_s": r.ttft(0.9),
                **raw,
            }
        )
    return out


def check(results: dict[tuple[str, int], RunResult]) -> list[tuple[str, bool]]:
    out = []
    for conc in sorted({c for _, c in results}):
        pa, rr, kv, oracle = (results.get((k, conc)) for k in ("prefix_affinity", "round_robin", "kv_events", ORACLE))
        if kv is not None:  # the kv_events policy's targets
            if oracle:
                ratio = kv.hit_rate / max(oracle.hit_rate, 1e-9)
                out.append(
                    (
                        f"c={conc}: kv_events {kv.hit_rate:.3f} >= {TARGET_KV_VS_ORACLE} x oracle "
                        f"{oracle.hit_rate:.3f} (ratio {ratio:.2f})",
                        ratio >= TARGET_KV_VS_ORACLE,
                    )
                )
            if kv.imbalance is not None and conc > 1:
                out.append(
                    (
                        f"c={conc}: kv_events max/mean in-flight {kv.imbalance:.2f} <= {TARGET_KV_IMBALANCE}",
                        kv.imbalance <= TARGET_KV_IMBALANCE,
                    )
                )
            kv90, pa90 = kv.ttft(0.9), pa.ttft(0.9) if pa else None
            if kv90 is not None and pa90 is not None:
                out.append((f"c={conc}: kv_events TTFT p90 {kv90:.3f} s < prefix_affinity {pa90:.3f} s", kv90 < pa90))
            continue
        if pa and oracle:
            out.append(
                (
                    f"c={conc}: prefix_affinity {pa.hit_rate:.3f} >= {TARGET_VS_ORACLE} x oracle "
                    f"{oracle.hit_rate:.3f} (ratio {pa.hit_rate / max(oracle.hit_rate, 1e-9):.2f})",
                    pa.hit_rate >= TARGET_VS_ORACLE * oracle.hit_rate,
                )
            )
        if pa and rr:
            out.append(
                (
                    f"c={conc}: prefix_affinity {pa.hit_rate:.3f} >= {TARGET_VS_ROUND_ROBIN} x round_robin "
                    f"{rr.hit_rate:.3f}",
                    pa.hit_rate >= TARGET_VS_ROUND_ROBIN * rr.hit_rate,
                )
            )
        if pa and pa.imbalance is not None and conc > 1:  # at 1 it measures the replicas' speeds
            out.append(
                (
                    f"c={conc}: prefix_affinity max/mean in-flight {pa.imbalance:.2f} <= {TARGET_IMBALANCE}",
                    pa.imbalance <= TARGET_IMBALANCE,
                )
            )
    return out


def distinct_prefix_tokens(r: RunResult, w: Workload) -> int:
    """skew none: the workload's distinct prefix tokens: every conversation's final prompt, with the
    shared system prompt (~system_chars / 2.8 tokens, plus the template) counted once."""
    shared = int(w.system_chars / 2.8) + 4
    return sum(r.final_prompt_tokens) - (len(r.final_prompt_tokens) - 1) * shared


def distinct_zipf_tokens(w: Workload, base_url: str) -> tuple[int, int]:
    """skew zipf: (distinct prefix tokens, conversations used): per conversation, the longest prompt
    the schedule sends (each earlier turn is its prefix), counted by the engine's /tokenize, with
    the shared system prompt counted once."""
    longest: dict[int, int] = {}
    for conv, turn in zipf_schedule(w):
        longest[conv] = max(longest.get(conv, 0), turn)

    def count(messages: list[dict[str, str]]) -> int:
        r = httpx.post(f"{base_url}/tokenize", json={"model": MODEL, "messages": messages}, timeout=30)
        r.raise_for_status()
        return int(r.json()["count"])

    shared = int(w.system_chars / 2.8) + 4
    total = sum(count(scripted_turn(w, conv, turn)) for conv, turn in longest.items())
    return total - (len(longest) - 1) * shared, len(longest)


def tokenize_cost(server: Any, w: Workload, calls: int = 100) -> dict[str, float]:
    """What the kv_events match's /tokenize costs on an idle replica, sequentially, for this
    workload's prompts: the round trip as a client sees it (p50, p90) and the engine's API-server
    process CPU per call."""
    if w.skew == "zipf":
        prompts = [scripted_turn(w, c, t) for c, t in zipf_schedule(w)]
    else:
        prompts = [opening(w, c) for c in range(w.conversations)]
    times: list[float] = []
    with httpx.Client(timeout=30) as client:
        cpu0 = cpu_seconds(0, server.process.pid)
        for i in range(calls):
            body = {"model": MODEL, "messages": prompts[i % len(prompts)]}
            start = time.perf_counter()
            client.post(f"{server.base_url}/tokenize", json=body).raise_for_status()
            times.append(time.perf_counter() - start)
        cpu = cpu_seconds(0, server.process.pid) - cpu0
    times.sort()
    return {
        "calls": calls,
        "round_trip_p50_ms": times[len(times) // 2] * 1000,
        "round_trip_p90_ms": times[int(0.9 * len(times))] * 1000,
        "engine_cpu_ms_per_call": cpu * 1000 / calls,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conversations", type=int, default=Workload.conversations)
    p.add_argument("--turns", type=int, default=Workload.turns)
    p.add_argument("--system-chars", type=int, default=Workload.system_chars)
    p.add_argument("--preamble-chars", type=int, default=Workload.preamble_chars)
    p.add_argument("--max-tokens", type=int, default=Workload.max_tokens)
    p.add_argument(
        "--concurrency",
        default="1,8",
        help="comma-separated; each level is one pass of every policy (1: placement alone)",
    )
    p.add_argument("--kv-tokens", type=int, default=8192, help="KV budget of each of the two replicas")
    p.add_argument(
        "--policies",
        default="prefix_affinity,round_robin,oracle",
        help="comma-separated (round_robin, prefix_affinity, kv_events, oracle, any balancer); "
        "`prefix_affinity@1.0` runs it with affinity_epsilon 1.0, `kv_events@1.0` with kv_epsilon 1.0, "
        "`kv_events@0.2+0` with kv_epsilon 0.2 and kv_slack 0 (`@+0`: the slack alone); kv_events encodes the "
        "prompts with the model's tokenizer (the pool's `tokenizer`), `kv_events:engine` asks the engines instead; "
        "`:KEY=VALUE` sets any pool setting (VALUE read as YAML), e.g. `kv_events:kv_saturation_kv_usage=0.95`",
    )
    p.add_argument(
        "--epsilon", type=float, help="the pool's affinity_epsilon or kv_epsilon (default: the config default)"
    )
    p.add_argument("--gateways", type=int, default=1, help="gateway replicas over the same engines")
    p.add_argument("--skew", choices=("none", "zipf"), default="none", help="how requests pick a conversation")
    p.add_argument("--zipf-s", type=float, default=Workload.zipf_s, help="zipf: the exponent")
    p.add_argument("--requests", type=int, default=0, help="zipf: requests in all (default 8 x conversations)")
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every policy this many times at each concurrency, the order rotated each time; a row pools "
        "its repeats (the TTFT quantiles over every repeat's requests, each repeat's p90 beside them)",
    )
    p.add_argument(
        "--no-warmup",
        dest="warmup",
        action="store_false",
        help="skip the unmeasured pass of the workload, straight to the replicas, before each concurrency's runs",
    )
    p.add_argument("--json", type=Path, help="also write the rows (one per policy and concurrency) here")
    p.add_argument(
        "--no-pin",
        dest="pin",
        action="store_false",
        help="leave each replica's API server and engine core free to run on any core (only the worker is bound)",
    )
    p.add_argument("--trace", type=Path, help="write every request's conversation, turn, backend and decision here")
    p.add_argument("--log-dir", type=Path, default=Path("/tmp/gateway-affinity-bench"))
    record.add_arguments(p)
    args = p.parse_args(argv)
    w = Workload(
        conversations=args.conversations,
        turns=args.turns,
        system_chars=args.system_chars,
        preamble_chars=args.preamble_chars,
        max_tokens=args.max_tokens,
        skew=args.skew,
        zipf_s=args.zipf_s,
        requests=args.requests,
    )
    levels = [int(x) for x in args.concurrency.split(",") if x]
    policies = [x for x in args.policies.split(",") if x]
    missing = servers.engine_missing("vllm")
    if missing:
        print(missing, file=sys.stderr)
        return 2
    per_token = kv_spec_from_hf_config(load_hf_config(servers.engine_env()["TINY_HF_DIR"])).bytes_per_token
    args.log_dir.mkdir(parents=True, exist_ok=True)
    common = {"max_model_len": 2048, "max_num_seqs": max(levels)}
    # Both replicas publish their KV events whatever the policy, so every policy runs on the same engines.
    events = [(servers.free_port(), servers.free_port()) for _ in range(2)]
    pair_specs = [
        {
            **common,
            "kv_cache_memory_bytes": args.kv_tokens * per_token,
            "cpu_omp_threads_bind": str(i),
            "cpu_affinity": str(i) if args.pin else None,
            "log_path": args.log_dir / f"replica-{i}.log",
            "extra_args": ["--kv-events-config", servers.kv_events_config(pub, replay)],
        }
        for i, (pub, replay) in enumerate(events)
    ]
    oracle_spec = {
        **common,
        "kv_cache_memory_bytes": 2 * args.kv_tokens * per_token,
        "cpu_omp_threads_bind": "0",
        "log_path": args.log_dir / "oracle.log",
    }
    want_oracle = ORACLE in policies
    gateway_policies = [x for x in policies if x != ORACLE]
    print(
        f"workload: {w}; concurrency {levels}; {args.gateways} gateway(s); KV {per_token} B/token, "
        f"{args.kv_tokens} tokens ({args.kv_tokens * per_token} B) per replica, oracle {2 * args.kv_tokens}",
        flush=True,
    )
    block = SharedPrefixConfig().block_chars
    shared_bytes = len(canonical_prompt({"messages": opening(w, 0)[:1]}).encode())
    print(
        f"gateway fingerprint blocks of {block} bytes; the shared system prompt is {shared_bytes} bytes of the "
        f"canonical prompt, so the first block is {'SHARED by' if shared_bytes >= block else 'distinct per'} "
        "conversation",
        flush=True,
    )
    t0 = time.monotonic()
    load0 = " ".join(f"{x:.1f}" for x in os.getloadavg())
    results: dict[tuple[str, int], RunResult] = {}
    with replicas(pair_specs + ([oracle_spec] if want_oracle else [])) as started:
        pair = started[:2]
        infos = [kv_cache_info(s.metrics_url) for s in started]
        print(
            f"replicas ready in {time.monotonic() - t0:.0f} s; "
            + "; ".join(
                f"{s.log_path.name}: {i.get('kv_cache_size_tokens')} KV tokens in "
                f"{i.get('num_gpu_blocks')} blocks of {i.get('block_size')}"
                for s, i in zip(started, infos, strict=True)
            ),
            flush=True,
        )
        zipf_distinct = distinct_zipf_tokens(w, pair[0].base_url) if w.skew == "zipf" else None
        match = tokenize_cost(pair[0], w) if "kv_events" in gateway_policies else None
        if match is not None:
            print(
                f"the match's POST /tokenize on an idle replica, {match['calls']} calls: round trip p50 "
                f"{match['round_trip_p50_ms']:.1f} ms, p90 {match['round_trip_p90_ms']:.1f} ms; "
                f"the engine's API server {match['engine_cpu_ms_per_call']:.2f} ms CPU a call",
                flush=True,
            )
        for conc in levels:
            if args.warmup:  # the engines' first batches of this size are slow: outside every policy's figures
                for s in started:
                    reset_prefix_cache(s.base_url)
                warm = drive("warm-up", [s.v1_url for s in pair], [s.metrics_url for s in pair], w, conc)
                print(f"c={conc} warm-up (unmeasured, straight to the pair) in {warm.seconds:.1f} s", flush=True)
                if want_oracle:
                    drive("warm-up", [started[2].v1_url], [started[2].metrics_url], w, conc)
            runs: dict[str, list[RunResult]] = {policy: [] for policy in policies}
            for rep in range(args.repeat):
                # rotated, so that no policy always runs first (or right after another one)
                for policy in (
                    gateway_policies[rep % len(gateway_policies) :] + gateway_policies[: rep % len(gateway_policies)]
                ):
                    # prefix_affinity@1.0: with affinity_epsilon 1.0; kv_events@0.2+0: kv_epsilon 0.2, kv_slack 0;
                    # kv_events:engine: the prompts' ids asked of the engines, not encoded by the gateway
                    named, _, variant = policy.partition(":")
                    balancer, _, tuning = named.partition("@")
                    eps, _, slack = tuning.partition("+")
                    epsilon = float(eps) if eps else args.epsilon
                    # kv_events:kv_saturation_waiting=16: any pool setting, its value read as YAML
                    settings = [part.partition("=") for part in variant.split(":") if "=" in part]
                    extra = {key: yaml.safe_load(value) for key, _, value in settings}
                    engine_ids = "engine" in variant.split(":")
                    tokenizer = None if engine_ids else servers.engine_env()["TINY_HF_DIR"]
                    r = run_gateway_policy(
                        balancer,
                        pair,
                        w,
                        conc,
                        epsilon,
                        args.gateways,
                        events,
                        int(slack) if slack else None,
                        tokenizer,
                        extra,
                    )
                    runs[policy].append(r)
                    print(
                        f"c={conc} {policy}: hit rate {r.hit_rate:.3f}, TTFT p90 {_fmt(r.ttft(0.9), '.3f')} s "
                        f"in {r.seconds:.1f} s",
                        flush=True,
                    )
                if want_oracle:
                    o = started[2]
                    reset_prefix_cache(o.base_url)
                    r = drive(ORACLE, [o.v1_url], [o.metrics_url], w, conc)
                    runs[ORACLE].append(r)
                    print(f"c={conc} oracle: hit rate {r.hit_rate:.3f} in {r.seconds:.1f} s", flush=True)
            for policy in policies:
                results[(policy, conc)] = pooled(runs[policy])
    if zipf_distinct is not None:
        distinct, used = zipf_distinct
        size = f"~{distinct} in the {used} conversations the schedule uses"
    else:
        distinct = distinct_prefix_tokens(next(iter(results.values())), w)
        size = f"~{distinct}"
    print()
    print(table(results))
    print()
    print(
        f"distinct prefix tokens of the workload {size}; each replica's KV {args.kv_tokens} tokens = "
        f"{args.kv_tokens / distinct:.2f}x. Usage cross-check (sum cached_tokens / sum prompt_tokens): "
        + ", ".join(f"{k}@{c} {r.usage_cached / max(r.usage_prompt, 1):.3f}" for (k, c), r in results.items())
    )
    verdicts = check(results)
    for text, ok in verdicts:
        print(f"{'PASS' if ok else 'FAIL'}: {text}")
    load1 = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"total {time.monotonic() - t0:.0f} s; load average {load0} at the start, {load1} at the end "
        "(timing figures suffer from other load)"
    )
    table_rows = rows(results)
    if args.json:
        args.json.write_text(json.dumps(table_rows, indent=2))
    if args.trace:
        traces = [{"policy": k, "concurrency": c, "requests": r.trace} for (k, c), r in results.items()]
        args.trace.write_text(json.dumps(traces, indent=1))
    figures = {
        f"{row['policy']}@{row['concurrency']}": {
            k: row[k]
            for k in ("hit_rate", "ratio_to_oracle", "max_mean_inflight", "ttft_p50_s", "ttft_p90_s", "gateway_cpu_ms")
        }
        for row in table_rows
    }
    record.write_if_asked(
        args,
        "affinity",
        figures,
        notes=f"load average {load0} at the start, {load1} at the end",
        extra={
            "workload": asdict(w),
            "kv_tokens": args.kv_tokens,
            "distinct_prefix_tokens": distinct,
            "rows": table_rows,
            "tokenize_cost": match,
            "verdicts": [{"check": text, "ok": ok} for text, ok in verdicts],
        },
    )
    return 0 if all(ok for _, ok in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
