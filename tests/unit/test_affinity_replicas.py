"""Two gateway instances built from the same config and given the same request stream make the same
prefix_affinity choices from a cold start, without sharing any state: the routing is derived
from the request itself (blake2b fingerprint, rendezvous hash on backend names), never from process
state such as Python's randomised hash() or start-up order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter, deque
from pathlib import Path
from typing import Any

import pytest

from gateway.config import GatewayConfig
from gateway.config_loader import parse_config
from gateway.fleet.capacity import Capacity
from gateway.fleet.health import HealthState
from gateway.fleet.registry import Registry
from gateway.metrics import GatewayMetrics
from gateway.pipeline.context import Request
from gateway.pipeline.router import Router
from gateway.protocols.chat import CHAT
from gateway.protocols.inbound import parse_request

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
NAMES = ["vllm-a", "vllm-b", "vllm-c"]
WORDS = [
    "gateway",
    "replica",
    "prefix",
    "cache",
    "tokens",
    "stream",
    "route",
    "engine",
    "queue",
    "latency",
    "block",
    "hash",
]


def config(names: list[str] = NAMES, epsilon: float = 0.25) -> GatewayConfig:
    return parse_config(
        {
            "pools": {
                "vllm": {
                    "engine": "vllm",
                    "balancer": "prefix_affinity",
                    "affinity_epsilon": epsilon,
                    "backends": [{"name": n, "url": f"http://10.0.0.{i + 1}:8000"} for i, n in enumerate(names)],
                }
            },
            "routes": [{"model": "m", "pools": ["vllm"]}],
        },
        env={},
    )


def words(seed: int, n: int) -> str:
    return " ".join(WORDS[(seed * 7 + i * (seed % 5 + 1)) % len(WORDS)] for i in range(n)) + f" #{seed}"


def stream(conversations: int, turns: int, system_words: int) -> list[tuple[int, list[dict[str, str]]]]:
    """Interleaved multi-turn chats (turn t of every conversation, then t+1), sharing a system prompt."""
    system = {"role": "system", "content": "You are an agent. " + words(0, system_words)}
    chats = [
        [system, {"role": "user", "content": f"conversation {c}: " + words(c + 1, 150)}] for c in range(conversations)
    ]
    out = []
    for t in range(turns):
        for c, chat in enumerate(chats):
            out.append((c, [dict(m) for m in chat]))
            chat += [
                {"role": "assistant", "content": words(100 * c + t, 12)},
                {"role": "user", "content": words(1000 * c + t, 15)},
            ]
    return out


def choices(
    names: list[str] = NAMES, system_words: int = 10, in_flight_window: int = 0, conversations: int = 12, turns: int = 4
) -> list[str]:
    """The backend a cold gateway picks for each request of the stream. With `in_flight_window` > 0
    the last N requests stay in flight (so the load bound takes part), identically on every run."""
    cfg = config(names)
    registry = Registry(cfg)
    capacity, health = Capacity(registry, cfg.retry), HealthState(cfg.health)
    for backend in registry:
        health.set_health(backend, True)
    router = Router(cfg, registry, GatewayMetrics(), "nvidia_gpu")
    route = cfg.route_for("m")
    assert route is not None
    in_flight: deque[Any] = deque()
    picked = []
    for _, messages in stream(conversations, turns, system_words):
        raw = json.dumps({"model": "m", "messages": messages, "max_tokens": 16}).encode()
        inbound = parse_request("chat", raw, max_depth=64, max_n=8, max_messages=10_000)
        plan = router.plan(Request(CHAT, inbound, route, "m", {}, inbound.body, None))
        backend = plan.backends[0]
        router.learn(plan, backend.name)  # it served: the gateway learns once the first byte arrives
        picked.append(backend.name)
        if in_flight_window:
            capacity.acquire(backend)
            in_flight.append(backend)
            if len(in_flight) > in_flight_window:
                capacity.release(in_flight.popleft())
    return picked


@pytest.mark.parametrize("system_words", [10, 200], ids=["short-system-prompt", "shared-first-block"])
@pytest.mark.parametrize("window", [0, 5], ids=["sequential", "5-in-flight"])
def test_two_cold_instances_agree(system_words: int, window: int) -> None:
    a = choices(system_words=system_words, in_flight_window=window)
    b = choices(system_words=system_words, in_flight_window=window)
    assert a == b


def test_listing_order_of_named_backends_does_not_matter() -> None:
    """Rendezvous hashes backend names, so replicas whose configs list the backends in another order
    still agree (unnamed backends are named by position, `pool-i`: keep the order, or name them)."""
    assert choices(NAMES) == choices(list(reversed(NAMES))) == choices([NAMES[1], NAMES[2], NAMES[0]])


def test_cold_choices_spread_and_stick() -> None:
    """The agreement is not trivial: conversations spread over the pool, and each stays put."""
    picked = choices(system_words=10)
    per_conversation: dict[int, set[str]] = {}
    for (c, _), name in zip(stream(12, 4, 10), picked, strict=True):
        per_conversation.setdefault(c, set()).add(name)
    assert all(len(s) == 1 for s in per_conversation.values()), per_conversation
    spread = Counter(next(iter(s)) for s in per_conversation.values())
    assert len(spread) == len(NAMES), spread


@pytest.mark.slow
def test_separate_processes_agree() -> None:
    """Separate interpreters with different hash seeds: what two gateway processes would compute."""
    code = (
        "import json; from tests.unit.test_affinity_replicas import choices; "
        "print(json.dumps([choices(system_words=w, in_flight_window=5) for w in (10, 200)]))"
    )
    runs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True
        )
        runs.append(json.loads(out.stdout))
    assert runs[0] == runs[1]
    assert runs[0] == [choices(system_words=w, in_flight_window=5) for w in (10, 200)]


def test_new_conversations_behind_a_shared_system_prompt_spread() -> None:
    picked = choices(system_words=200)  # the system prompt alone is longer than one block
    first_turns = picked[:12]
    assert len(set(first_turns)) > 1, Counter(first_turns)
