"""Balancers: every kind's order, prefix affinity (learned, cold-start, load-bounded), bounded memory."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from typing import Any, get_args

import pytest

from engines.base import EngineLoad
from gateway.config import BackendConfig, BalancerKind, PoolConfig
from gateway.policy.balancer import (
    BalanceKey,
    Candidate,
    FirstHealthy,
    LeastLoad,
    PrefixAffinity,
    RoundRobin,
    Session,
    candidate_load,
    make_balancer,
    rendezvous,
)
from gateway.policy.prefix import fingerprint

pytestmark = pytest.mark.unit

NAMES = [f"b{i}" for i in range(8)]
POOL = PoolConfig(engine="sim", backends=(BackendConfig(url="http://127.0.0.1:1"),))
EPSILON = POOL.affinity_epsilon
NO_KEY = BalanceKey()


def cands(in_flight: Sequence[int] = (0,) * 8, **extra: Any) -> list[Candidate]:
    return [Candidate(name=f"b{i}", in_flight=n, **extra) for i, n in enumerate(in_flight)]


def names(ordered: Sequence[Candidate]) -> list[str]:
    return [c.name for c in ordered]


def fresh(name: str, in_flight: int = 0, **load: float) -> Candidate:
    return Candidate(name, in_flight, EngineLoad(**load), load_fresh=True)


def conversation_fp(seed: int, turns: int = 1) -> tuple[int, ...]:
    text = f"system prompt of conversation {seed}. " * 8
    for t in range(turns):
        text += f"user turn {t} of {seed}: " * 6 + f"assistant answer {t}. " * 6
    return fingerprint(text, 64)


# --- every kind -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", get_args(BalancerKind))
def test_every_balancer_returns_every_candidate_once(kind: BalancerKind) -> None:
    balancer = make_balancer(kind, POOL)
    pool = cands((3, 0, 5, 1, 1, 0, 9, 2), max_in_flight=4)
    for key in (NO_KEY, BalanceKey(fingerprint=conversation_fp(1), session="s")):
        ordered = balancer.order(pool, key)
        assert sorted(names(ordered)) == sorted(NAMES)
        assert set(names(ordered)[-2:]) == {"b2", "b6"}  # at max_in_flight: last, whatever the kind
    assert balancer.order([], NO_KEY) == []


@pytest.mark.parametrize(
    ("kind", "cls"),
    [
        ("least_load", LeastLoad),
        ("prefix_affinity", PrefixAffinity),
        ("round_robin", RoundRobin),
        ("session", Session),
        ("first_healthy", FirstHealthy),
    ],
)
def test_make_balancer(kind: BalancerKind, cls: type) -> None:
    assert isinstance(make_balancer(kind, POOL), cls)


def test_make_balancer_rejects_an_unknown_kind() -> None:
    with pytest.raises(ValueError, match="unknown balancer"):
        make_balancer("random", POOL)  # type: ignore[arg-type]


def test_affinity_uses_the_pools_epsilon() -> None:
    # Favourite at 3 in flight, seven others idle: mean after this request is 0.5. epsilon 10 allows
    # ceil(11 x 4 / 8) = 6, so it stays; epsilon 0.25 allows ceil(1.25 x 4 / 8) = 1, so it spills.
    # (affinity_slack 0 here: the absolute part of the bound has its own test.)
    fp = conversation_fp(7)
    favourite = names(rendezvous(fp[0].to_bytes(8, "big"), cands()))[0]
    pool = [Candidate(n, 3 if n == favourite else 0) for n in NAMES]
    loose = make_balancer("prefix_affinity", POOL.model_copy(update={"affinity_epsilon": 10.0, "affinity_slack": 0}))
    tight = make_balancer("prefix_affinity", POOL.model_copy(update={"affinity_slack": 0}))
    assert loose.order(pool, BalanceKey(fp))[0].name == favourite
    assert tight.order(pool, BalanceKey(fp))[0].name != favourite


def test_affinity_slack_keeps_a_small_pool_on_its_cache() -> None:
    """Two backends at low load: 5 vs 3 in flight is chance, not overload; the slack keeps the
    conversation on its cache (the affinity benchmark at 8 concurrent lost half its hits to such
    spills), and a real pile-up (9 vs 0) still spills."""
    fp = conversation_fp(8)
    balancer = make_balancer("prefix_affinity", POOL.model_copy(update={"affinity_slack": 4}))
    favourite = balancer.order([Candidate("a", 0), Candidate("b", 0)], BalanceKey(fp))[0].name
    other = "b" if favourite == "a" else "a"
    assert balancer.order([Candidate(favourite, 5), Candidate(other, 3)], BalanceKey(fp))[0].name == favourite
    assert balancer.order([Candidate(favourite, 9), Candidate(other, 0)], BalanceKey(fp))[0].name == other


# --- least_load -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pool", "first"),
    [
        ([Candidate("a", 3), Candidate("b", 1), Candidate("c", 2)], "b"),
        ([Candidate("b", 1), Candidate("a", 1)], "a"),  # tie: by name, not input order
        # A fresh scrape counts the engine's own queue (other replicas' requests)...
        ([fresh("a", 1, running=9, waiting=0), Candidate("b", 2, load_fresh=False)], "b"),
        # ...a stale one is ignored: in-flight only.
        ([Candidate("a", 1, EngineLoad(running=9, waiting=9), load_fresh=False), Candidate("b", 2)], "a"),
        # Waiting costs more than running.
        ([fresh("a", 0, running=4, waiting=2), fresh("b", 0, running=6, waiting=0)], "b"),
        # A fuller KV cache breaks an otherwise even tie.
        ([fresh("a", 2, running=2, kv_usage=0.9), fresh("b", 2, running=2, kv_usage=0.1)], "b"),
        # Our in-flight count is newer than the scrape: it wins when larger.
        ([fresh("a", 5, running=1), fresh("b", 3, running=3)], "b"),
    ],
)
def test_least_load_picks_the_least_loaded(pool: list[Candidate], first: str) -> None:
    assert LeastLoad().order(pool, NO_KEY)[0].name == first


def test_least_load_orders_everything_by_score() -> None:
    pool = cands((5, 0, 3, 1, 4, 2, 7, 6))
    assert names(LeastLoad().order(pool, NO_KEY)) == ["b1", "b3", "b5", "b2", "b4", "b0", "b7", "b6"]


def test_stale_and_fresh_backends_under_equal_load_look_equal() -> None:
    assert candidate_load(fresh("a", 4, running=4)) == candidate_load(Candidate("b", 4)) == 4.0


# --- round_robin ------------------------------------------------------------------------------------


def test_round_robin_rotates() -> None:
    balancer = RoundRobin()
    pool = cands((0, 0, 0))
    orders = [names(balancer.order(pool, NO_KEY)) for _ in range(4)]
    assert orders == [["b0", "b1", "b2"], ["b1", "b2", "b0"], ["b2", "b0", "b1"], ["b0", "b1", "b2"]]


def test_round_robin_instances_do_not_share_state() -> None:
    a, b = RoundRobin(), RoundRobin()
    a.order(cands(), NO_KEY)
    assert b.order(cands(), NO_KEY)[0].name == "b0"


# --- session ----------------------------------------------------------------------------------------


def test_session_is_sticky_and_spread() -> None:
    firsts = {}
    for i in range(400):
        key = BalanceKey(session=f"user-{i}")
        first = Session().order(cands(), key)[0].name
        assert all(Session().order(cands((i % 5,) * 8), key)[0].name == first for _ in range(2))
        firsts[i] = first
    spread = Counter(firsts.values())
    assert len(spread) == 8 and max(spread.values()) < 80  # 50 each on average


def test_session_ignores_load_but_removing_a_backend_moves_only_its_sessions() -> None:
    before = {i: Session().order(cands(), BalanceKey(session=str(i)))[0].name for i in range(300)}
    without_b3 = [c for c in cands() if c.name != "b3"]
    after = {i: Session().order(without_b3, BalanceKey(session=str(i)))[0].name for i in range(300)}
    moved = {i for i in before if before[i] != after[i]}
    assert moved and moved == {i for i in before if before[i] == "b3"}


def test_session_without_a_key_is_least_load() -> None:
    assert Session().order(cands((2, 1, 0, 3, 3, 3, 3, 3)), NO_KEY)[0].name == "b2"


# --- first_healthy ----------------------------------------------------------------------------------


def test_first_healthy_keeps_config_order_whatever_the_load() -> None:
    pool = [Candidate("z", 9), Candidate("a", 0), Candidate("m", 5)]
    assert names(FirstHealthy().order(pool, NO_KEY)) == ["z", "a", "m"]


# --- prefix_affinity --------------------------------------------------------------------------------


def test_rendezvous_order_is_stable_across_processes() -> None:
    # Golden order: replicas and restarts must agree, so this may never depend on PYTHONHASHSEED.
    assert names(rendezvous(b"conversation-1", cands())) == ["b4", "b3", "b7", "b6", "b5", "b1", "b0", "b2"]


def test_cold_start_goes_to_the_rendezvous_choice_of_the_first_block() -> None:
    fp = conversation_fp(3)
    expected = names(rendezvous(fp[0].to_bytes(8, "big"), cands()))
    assert names(PrefixAffinity(EPSILON).order(cands(), BalanceKey(fp))) == expected
    # Same first block, different rest: same backend.
    other = fp[:1] + conversation_fp(4)[1:]
    assert PrefixAffinity(EPSILON).order(cands(), BalanceKey(other))[0].name == expected[0]


def test_no_fingerprint_is_least_load() -> None:
    assert PrefixAffinity(EPSILON).order(cands((2, 1, 0, 3, 3, 3, 3, 3)), NO_KEY)[0].name == "b2"


def test_the_continuation_of_a_conversation_goes_where_the_conversation_went() -> None:
    balancer = PrefixAffinity(EPSILON)
    turn1, turn2 = conversation_fp(11, turns=1), conversation_fp(11, turns=2)
    assert turn2[: len(turn1)] == turn1
    cold = names(rendezvous(turn1[0].to_bytes(8, "big"), cands()))[0]
    # The first turn spilled off its rendezvous choice, which was busy at the time.
    busy = [Candidate(n, 5 if n == cold else 0) for n in NAMES]
    went = balancer.order(busy, BalanceKey(turn1))[0].name
    assert went != cold
    balancer.learn(turn1, went, 0.0)
    # The next turn, on an idle pool, follows the conversation rather than the cold-start hash.
    assert balancer.order(cands(), BalanceKey(turn2))[0].name == went
    balancer.learn(turn2, went, 1.0)
    assert balancer.order(cands(), BalanceKey(conversation_fp(11, turns=3)))[0].name == went


def test_the_longest_learned_match_wins() -> None:
    balancer = PrefixAffinity(EPSILON)
    p = tuple(range(100, 106))  # 6 blocks: its last index (5) is not one of the 1, 2, 4... checkpoints
    balancer.learn(p, "b1", 0.0)
    balancer.learn((*p, 200, 201, 202, 203, 204, 205), "b2", 1.0)
    assert balancer.order(cands(), BalanceKey((*p, 200, 201, 202, 203, 204, 205, 300)))[0].name == "b2"
    assert balancer.order(cands(), BalanceKey((*p, 999, 998, 997)))[0].name == "b1"


def test_a_learned_backend_that_left_the_pool_is_skipped() -> None:
    balancer = PrefixAffinity(EPSILON)
    fp = conversation_fp(5)
    balancer.learn(fp, "gone", 0.0)
    expected = names(rendezvous(fp[0].to_bytes(8, "big"), cands()))
    assert names(balancer.order(cands(), BalanceKey(fp))) == expected


def test_a_shorter_match_on_a_present_backend_beats_a_longer_one_on_a_departed_backend() -> None:
    balancer = PrefixAffinity(EPSILON)
    fp = conversation_fp(6, turns=3)
    cold = names(rendezvous(fp[0].to_bytes(8, "big"), cands()))[0]
    warm = next(n for n in NAMES if n != cold)
    balancer.learn(fp[:6], warm, 0.0)
    balancer.learn(fp[:20], "gone", 1.0)
    assert balancer.order(cands(), BalanceKey(fp))[0].name == warm


def test_a_single_request_does_not_spill() -> None:
    # Sequential requests on one hot prefix: each finishes before the next, so all stay on one backend.
    balancer = PrefixAffinity(EPSILON)
    fp = conversation_fp(9)
    chosen = set()
    for _ in range(50):
        first = balancer.order(cands(), BalanceKey(fp))[0].name
        balancer.learn(fp, first, 0.0)
        chosen.add(first)
    assert len(chosen) == 1


@pytest.mark.parametrize(
    ("favourite_load", "others", "stays"),
    [
        (0, 0, True),
        (1, 0, False),  # ceil(1.25 x 2/8) = 1: a second concurrent request goes elsewhere
        (10, 10, True),  # even load: ceil(1.25 x 81/8) = 13
        (13, 10, True),  # ceil(1.25 x 84/8) = 14: 13 + this one fits
        (14, 10, False),  # ceil(1.25 x 85/8) = 14: 14 + this one does not
        (100, 10, False),
    ],
)
def test_an_overloaded_favourite_spills_to_the_next_rendezvous_choice(
    favourite_load: int, others: int, stays: bool
) -> None:
    fp = conversation_fp(21)
    preference = names(rendezvous(fp[0].to_bytes(8, "big"), cands()))
    pool = [Candidate(n, favourite_load if n == preference[0] else others) for n in NAMES]
    ordered = names(PrefixAffinity(EPSILON).order(pool, BalanceKey(fp)))
    assert ordered == (preference if stays else [*preference[1:], preference[0]])


def test_a_spill_goes_to_the_least_loaded_backend() -> None:
    fp = conversation_fp(21)
    preference = names(rendezvous(fp[0].to_bytes(8, "big"), cands()))
    loads = dict(zip(preference, (30, 9, 9, 2, 9, 9, 9, 9), strict=True))
    ordered = names(PrefixAffinity(EPSILON).order([Candidate(n, loads[n]) for n in NAMES], BalanceKey(fp)))
    assert ordered == [preference[3], *[n for n in preference if loads[n] == 9], preference[0]]


def test_retries_after_the_favourite_go_to_the_least_loaded() -> None:
    fp = conversation_fp(21)
    preference = names(rendezvous(fp[0].to_bytes(8, "big"), cands()))
    loads = dict(zip(preference, (1, 5, 4, 0, 3, 3, 3, 3), strict=True))
    ordered = names(PrefixAffinity(EPSILON).order([Candidate(n, loads[n]) for n in NAMES], BalanceKey(fp)))
    assert ordered[:3] == [preference[0], preference[3], preference[4]]


def test_fresh_engine_load_counts_toward_the_bound() -> None:
    fp = conversation_fp(21)
    preference = names(rendezvous(fp[0].to_bytes(8, "big"), cands()))
    # Our in-flight is 0 everywhere, but the favourite's engine reports a queue from other replicas.
    pool = [fresh(n, 0, running=40.0 if n == preference[0] else 0.0, waiting=0.0) for n in NAMES]
    assert PrefixAffinity(EPSILON).order(pool, BalanceKey(fp))[0].name == preference[1]
    stale = [Candidate(c.name, 0, c.load, load_fresh=False) for c in pool]
    assert PrefixAffinity(EPSILON).order(stale, BalanceKey(fp))[0].name == preference[0]


def simulate(fps: Sequence[tuple[int, ...]], balancer: PrefixAffinity) -> dict[str, int]:
    """Requests arrive and none finishes: in-flight counts only grow."""
    in_flight = dict.fromkeys(NAMES, 0)
    for fp in fps:
        pool = [Candidate(n, in_flight[n]) for n in NAMES]
        first = balancer.order(pool, BalanceKey(fp))[0].name
        balancer.learn(fp, first, 0.0)
        in_flight[first] += 1
    return in_flight


def test_one_hot_prefix_spreads_within_the_bound_instead_of_collapsing() -> None:
    # vllm-router #179: pure prefix hashing put 480 requests on one backend and left 7 idle.
    hot = conversation_fp(1)
    rnd = random.Random(0)
    fps = [hot[:4] + fingerprint(f"task {i} " * rnd.randint(20, 60), 64) for i in range(480)]
    in_flight = simulate(fps, PrefixAffinity(EPSILON))
    mean = sum(in_flight.values()) / len(NAMES)
    assert max(in_flight.values()) / mean <= 1.3
    assert min(in_flight.values()) > 0


def test_hot_prefix_with_requests_finishing_stays_balanced() -> None:
    hot = conversation_fp(2)
    rnd = random.Random(1)
    balancer = PrefixAffinity(EPSILON)
    in_flight = dict.fromkeys(NAMES, 0)
    worst = 0.0
    for step in range(5000):
        fp = (*hot[:4], step)
        pool = [Candidate(n, in_flight[n]) for n in NAMES]
        first = balancer.order(pool, BalanceKey(fp))[0].name
        balancer.learn(fp, first, float(step))
        in_flight[first] += 1
        while sum(in_flight.values()) > 400:  # a full system: one finishes for each that arrives
            busy = [n for n in NAMES if in_flight[n]]
            in_flight[rnd.choice(busy)] -= 1
        if step > 1000:
            worst = max(worst, max(in_flight.values()) / (sum(in_flight.values()) / len(NAMES)))
    assert worst <= 1.3


def test_uniform_conversations_spread_evenly() -> None:
    # Idle pool, many distinct conversations: the rendezvous hash alone must spread them.
    balancer = PrefixAffinity(EPSILON)
    counts = Counter(balancer.order(cands(), BalanceKey(conversation_fp(i)))[0].name for i in range(1600))
    mean = 1600 / len(NAMES)
    assert len(counts) == 8
    assert max(counts.values()) / mean <= 1.2 and min(counts.values()) / mean >= 0.8


def test_uniform_conversations_under_load_stay_balanced() -> None:
    fps = [conversation_fp(i) for i in range(800)]
    in_flight = simulate(fps, PrefixAffinity(EPSILON))
    assert max(in_flight.values()) / (800 / len(NAMES)) <= 1.3


def test_cold_start_is_deterministic_across_instances() -> None:
    # Two replicas that share nothing see the same requests and loads: they must choose alike.
    rnd = random.Random(5)
    stream = [conversation_fp(rnd.randrange(50), turns=rnd.randint(1, 3)) for _ in range(600)]
    a, b = PrefixAffinity(EPSILON), PrefixAffinity(EPSILON)
    in_flight = dict.fromkeys(NAMES, 0)
    for i, fp in enumerate(stream):
        pool = [Candidate(n, in_flight[n]) for n in NAMES]
        first_a = names(a.order(pool, BalanceKey(fp)))
        first_b = names(b.order(list(reversed(pool)), BalanceKey(fp)))  # input order must not matter
        assert first_a == first_b
        a.learn(fp, first_a[0], float(i))
        b.learn(fp, first_b[0], float(i))
        in_flight[first_a[0]] += 1
        if i % 3 == 0:
            in_flight[rnd.choice([n for n in NAMES if in_flight[n]])] -= 1


def test_affinity_memory_is_bounded_under_100k_distinct_prefixes() -> None:
    balancer = PrefixAffinity(EPSILON, max_entries=1000)
    for i in range(100_000):
        balancer.learn((i, 10**6 + i, 2 * 10**6 + i, 3 * 10**6 + i, 4 * 10**6 + i), NAMES[i % 8], float(i))
        if i % 997 == 0:
            assert len(balancer) <= 1000
    assert len(balancer) == 1000


def test_learn_stores_a_few_entries_per_request() -> None:
    balancer = PrefixAffinity(EPSILON)
    balancer.learn(tuple(range(500)), "b1", 0.0)
    assert len(balancer) == 10  # blocks 0, 1, 3, 7, ..., 255 and the last (499)


def test_recently_used_prefixes_survive_eviction() -> None:
    # Least-recently-used: a prefix learned again every 10 requests outlives a flood of one-offs.
    balancer = PrefixAffinity(EPSILON, max_entries=64)
    hot = (10**9, 10**9 + 1, 10**9 + 2)
    for i in range(5000):
        if i % 10 == 0:
            balancer.learn(hot, "b6", float(i))
        balancer.learn((2 * i, 2 * i + 1), NAMES[i % 8], float(i))
        assert balancer.order(cands(), BalanceKey((*hot, 77)))[0].name == "b6"
        assert balancer.order(cands(), BalanceKey((*hot[:2], 77)))[0].name == "b6"  # a checkpoint


def test_a_spill_does_not_rehome_a_conversation() -> None:
    """benchmarks/affinity.py found conversations drifting: each load spill re-homed them."""
    balancer = PrefixAffinity(EPSILON)
    turn1, turn2, turn3 = (conversation_fp(21, turns=t) for t in (1, 2, 3))
    home = balancer.order(cands(), BalanceKey(turn1))[0].name
    balancer.learn(turn1, home, 0.0)
    busy = [Candidate(n, 9 if n == home else 0) for n in NAMES]
    ordered, learned_home = balancer.decide(busy, BalanceKey(turn2))
    spilled = ordered[0].name
    assert spilled != home and learned_home == home
    balancer.learn(turn2, spilled, 1.0, learned_home)
    assert balancer.order(cands(), BalanceKey(turn3))[0].name == home
