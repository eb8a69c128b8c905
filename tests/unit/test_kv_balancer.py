"""The kv_events balancer (gateway.policy.cached_prefix and balancer.KVEvents), table-driven: the
longest cached prefix, sticky until saturated (bounded load, the engine's queue, its KV usage),
then the least loaded; the bounded-load hash when nothing is cached; loads that count requests
decided and not yet started, so that a burst spreads."""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from engines.base import EngineLoad
from gateway.config import BackendConfig, PoolConfig
from gateway.config_loader import parse_config
from gateway.fleet.registry import Registry
from gateway.policy.balancer import BalanceKey, Candidate, KVEvents, candidate_load, kv_load, make_balancer
from gateway.policy.cached_prefix import CachedPrefix, Saturation

pytestmark = pytest.mark.unit

TWO = {
    "pools": {
        "p": {
            "engine": "vllm",
            "balancer": "kv_events",
            "backends": [{"name": n, "url": f"http://127.0.0.1:{9 + i}"} for i, n in enumerate(("b0", "b1"))],
        }
    },
    "routes": [{"model": "m", "pools": ["p"]}],
}
DEFAULTS = PoolConfig(engine="sim", balancer="kv_events", backends=(BackendConfig(url="http://127.0.0.1:1"),))
POOL = DEFAULTS.model_copy(update={"kv_saturation_waiting": 4, "kv_saturation_kv_usage": 0.95})
"""A pool that consults the engines' own saturation signals (off by default)."""


def balancer() -> KVEvents:
    made = make_balancer("kv_events", POOL)
    assert isinstance(made, KVEvents)
    return made


def cands(*loads: int, **extra: Any) -> list[Candidate]:
    return [Candidate(name=f"b{i}", in_flight=n, **extra) for i, n in enumerate(loads)]


def held(prompt_blocks: int, **blocks: int) -> CachedPrefix:
    return CachedPrefix(tuple(blocks.items()), prompt_blocks)


def fresh(name: str, in_flight: int = 0, **load: float) -> Candidate:
    """A backend scraped just now with `in_flight` of ours on it."""
    return Candidate(name, in_flight, EngineLoad(**load), load_fresh=True, in_flight_at_scrape=in_flight)


def stale(name: str, in_flight: int = 0, **load: float) -> Candidate:
    return Candidate(name, in_flight, EngineLoad(**load), load_fresh=False)


CASES: list[tuple[str, Sequence[Candidate], BalanceKey, str, str]] = [
    ("longest prefix wins", cands(0, 0, 0), BalanceKey(cached=held(6, b0=2, b1=5)), "b1", "sticky"),
    ("longest prefix over a lighter load", cands(1, 2, 3), BalanceKey(cached=held(6, b0=2, b1=5)), "b1", "sticky"),
    ("equal prefixes: the least loaded", cands(3, 1, 0), BalanceKey(cached=held(6, b0=4, b1=4)), "b1", "sticky"),
    # The holder's bound with the defaults: max(ceil(1.5 x mean after), mean after + 4).
    ("within the slack: sticky", cands(0, 4, 1), BalanceKey(cached=held(6, b1=5)), "b1", "sticky"),
    ("past the load bound: spill", cands(0, 9, 1), BalanceKey(cached=held(6, b1=5)), "b0", "spill"),
    (
        "spill prefers a shorter prefix among equal loads",
        cands(0, 9, 0),
        BalanceKey(cached=held(6, b1=5, b2=2)),
        "b2",
        "spill",
    ),
    (
        "spill prefers a partial holder over a lighter empty one",
        cands(1, 9, 0),
        BalanceKey(cached=held(6, b0=3, b1=5)),
        "b0",
        "spill",
    ),
    (
        "decided requests are load",
        [Candidate("b0", 0), Candidate("b1", 0, decided=9)],
        BalanceKey(cached=held(6, b1=5)),
        "b0",
        "spill",
    ),
    (
        "the engine's queue saturates it",
        [fresh("b0"), fresh("b1", waiting=4)],
        BalanceKey(cached=held(6, b1=5)),
        "b0",
        "spill",
    ),
    (
        "a full KV cache saturates it",
        [fresh("b0"), fresh("b1", 2, kv_usage=0.97)],
        BalanceKey(cached=held(6, b1=5)),
        "b0",
        "spill",
    ),
    (
        "a full KV cache under the mean load does not",
        [fresh("b0", 3), fresh("b1", 1, kv_usage=0.99)],
        BalanceKey(cached=held(6, b1=5)),
        "b1",
        "sticky",
    ),
    (
        "a stale scrape does not",
        [stale("b0"), stale("b1", waiting=9, kv_usage=0.99)],
        BalanceKey(cached=held(6, b1=5)),
        "b1",
        "sticky",
    ),
    ("no key: least loaded", cands(2, 0, 1), BalanceKey(), "b1", "least_load"),
    ("nothing cached: no key still least loaded", cands(2, 1, 0), BalanceKey(cached=held(6)), "b2", "least_load"),
]


@pytest.mark.parametrize(("case", "candidates", "key", "favourite", "reason"), CASES, ids=[c[0] for c in CASES])
def test_the_decision_table(
    case: str, candidates: Sequence[Candidate], key: BalanceKey, favourite: str, reason: str
) -> None:
    ordered, choice = balancer().choose(candidates, key)
    assert choice is not None
    assert (choice.favourite, choice.reason) == (favourite, reason)
    assert ordered[0].name == favourite and sorted(c.name for c in ordered) == sorted(c.name for c in candidates)


def test_nothing_cached_uses_the_consistent_hash_and_replicas_agree() -> None:
    """Two gateway replicas (two balancer objects) send a new conversation to the same backend,
    whether they know the prompt's ids (none held) or not."""
    for key in (BalanceKey(anchor=12345, cached=held(3)), BalanceKey(anchor=12345)):
        first, second = balancer().choose(cands(1, 1, 1, 1), key), balancer().choose(cands(1, 1, 1, 1), key)
        assert first[1] is not None and second[1] is not None
        assert first[1].reason == "hash" and first[1].favourite == second[1].favourite


def test_the_remembered_hash_order_follows_the_backends() -> None:
    """The hash order is kept per conversation, but a backend added or gone gives the order a fresh
    balancer computes for the new set, never the old set's."""
    b = balancer()
    for n in range(64):
        key = BalanceKey(anchor=n * 7919 + 1)
        for backends in (cands(0, 0), cands(0, 0, 0, 0), cands(0, 0)[1:], cands(0, 0, 0)):
            remembered = b.choose(backends, key)[1]
            computed = balancer().choose(backends, key)[1]
            assert remembered is not None and computed is not None
            assert remembered.favourite == computed.favourite


def test_when_every_engine_reports_a_queue_the_holder_keeps_it() -> None:
    both = [fresh("b0", waiting=6), fresh("b1", 1, waiting=6)]
    choice = balancer().choose(both, BalanceKey(cached=held(6, b1=5)))[1]
    assert choice is not None and (choice.favourite, choice.reason) == ("b1", "sticky")


def test_the_hash_choice_yields_under_load() -> None:
    """Ids known and held nowhere (a new or evicted conversation): the plain bound, no slack."""
    key = BalanceKey(anchor=12345, cached=held(3))
    choice = balancer().choose(cands(0, 0, 0, 0), key)[1]
    assert choice is not None
    loads = [0, 0, 0, 0]
    loads[int(choice.favourite[1:])] = 3  # 4 > ceil(1.5 x (3 + 1) / 4) = 2
    spilled = balancer().choose(cands(*loads), key)[1]
    assert spilled is not None and spilled.reason == "spill" and spilled.favourite != choice.favourite


def test_ids_not_known_yet_keep_the_hash_home_within_the_slack() -> None:
    """This gateway does not know the prompt's ids (another replica served the conversation's
    earlier turns): its hash home most likely holds it, so the home keeps it up to the holder's
    bound, and no further."""
    blind = BalanceKey(anchor=12345)
    home = balancer().choose(cands(0, 0, 0, 0), blind)[1]
    assert home is not None and home.reason == "hash"
    at = int(home.favourite[1:])
    loads = [0, 0, 0, 0]
    loads[at] = 3  # 4 <= (3 + 1) / 4 + 4 = 5
    kept = balancer().choose(cands(*loads), blind)[1]
    assert kept is not None and (kept.favourite, kept.reason) == (home.favourite, "hash")
    loads[at] = 5  # 6 > (5 + 1) / 4 + 4 = 5.5
    moved = balancer().choose(cands(*loads), blind)[1]
    assert moved is not None and moved.reason == "spill" and moved.favourite != home.favourite


def test_new_conversations_spread_evenly() -> None:
    b = balancer()
    counts = Counter(b.order(cands(0, 0, 0, 0), BalanceKey(anchor=n * 7919 + 1))[0].name for n in range(400))
    assert len(counts) == 4 and min(counts.values()) > 0.7 * 100


@pytest.mark.parametrize("engines", [2, 4])
def test_a_burst_with_one_system_prompt_spreads_by_load(engines: int) -> None:
    """32 requests sharing a system prompt that only b0 has cached, decided together: none has
    started, so in_flight is 0 for all; the router counts each decision (Candidate.decided)."""
    b = balancer()
    decided = [0] * engines
    key = BalanceKey(cached=held(8, b0=4))
    for _ in range(32):
        candidates = [Candidate(f"b{i}", 0, decided=decided[i]) for i in range(engines)]
        decided[int(b.order(candidates, key)[0].name[1:])] += 1
    mean = 32 / engines
    holder_bound = max(math.ceil((1 + POOL.kv_epsilon) * mean), mean + POOL.kv_slack)
    assert all(decided) and max(decided) <= holder_bound, decided
    assert sorted(decided)[-2] <= math.ceil((1 + POOL.kv_epsilon) * mean), decided  # the rest spread
    assert decided[0] == max(decided)  # the cache holder still takes the largest share


def test_without_counting_decisions_the_burst_collapses() -> None:
    """The failure the counting prevents: loads that only change once a request starts."""
    b = balancer()
    key = BalanceKey(cached=held(8, b0=4))
    picks = Counter(b.order(cands(0, 0), key)[0].name for _ in range(32))
    assert picks == {"b0": 32}


def test_a_full_backend_goes_last_even_when_it_holds_the_prefix() -> None:
    full = [Candidate("b0", 2, max_in_flight=2), Candidate("b1", 9)]
    ordered = balancer().order(full, BalanceKey(cached=held(6, b0=5)))
    assert [c.name for c in ordered] == ["b1", "b0"]


def test_the_explanation_names_blocks_and_loads() -> None:
    choice = balancer().choose(cands(1, 0), BalanceKey(cached=held(6, b0=5)))[1]
    assert choice is not None
    assert choice.explanation == "kv_events sticky b0; blocks b0:5,b1:0 of 6; load b0:1,b1:0"


def test_saturation_thresholds_come_from_the_pool() -> None:
    pool = POOL.model_copy(update={"kv_saturation_waiting": None, "kv_saturation_kv_usage": None, "kv_epsilon": 10.0})
    made = make_balancer("kv_events", pool)
    assert isinstance(made, KVEvents)
    busy = [fresh("b0"), fresh("b1", 3, waiting=50, kv_usage=1.0)]
    choice = made.choose(busy, BalanceKey(cached=held(6, b1=5)))[1]
    assert choice is not None and choice.reason == "sticky"
    assert Saturation() == Saturation(
        DEFAULTS.kv_epsilon, DEFAULTS.kv_slack, DEFAULTS.kv_saturation_waiting, DEFAULTS.kv_saturation_kv_usage
    )


def test_by_default_an_engines_own_signals_do_not_move_a_conversation() -> None:
    """Unset thresholds: a holder whose scrape shows a long queue and a full cache keeps the
    request while it is within the load bound; with them set it spills."""
    made = make_balancer("kv_events", DEFAULTS)
    assert isinstance(made, KVEvents)
    busy = [fresh("b0"), fresh("b1", 3, waiting=4, kv_usage=1.0)]  # load 4 against 0: within the bound
    choice = made.choose(busy, BalanceKey(cached=held(6, b1=5)))[1]
    assert choice is not None and (choice.favourite, choice.reason) == ("b1", "sticky")
    choice = balancer().choose(busy, BalanceKey(cached=held(6, b1=5)))[1]
    assert choice is not None and (choice.favourite, choice.reason) == ("b0", "spill")


def test_of_equal_holders_the_conversations_home_wins_over_a_lighter_load() -> None:
    """Both hold the prompt (it spilled once): it goes back to its hash home while there is room, so
    turns do not alternate and keep two copies warm."""
    anchor = 12345
    home = balancer().choose(cands(0, 0), BalanceKey(anchor=anchor))[1]
    assert home is not None and home.reason == "hash"
    loads = [0, 0]
    loads[int(home.favourite[1:])] = 1  # one request more on the home, still under the bound (3)
    choice = balancer().choose(cands(*loads), BalanceKey(anchor=anchor, cached=held(4, b0=3, b1=3)))[1]
    assert choice is not None and (choice.favourite, choice.reason) == (home.favourite, "sticky")


def test_the_slack_keeps_a_holder_past_the_bound_but_not_a_new_conversations_home() -> None:
    slack = balancer()  # kv_slack 4 by default
    none = make_balancer("kv_events", POOL.model_copy(update={"kv_slack": 0}))
    assert isinstance(none, KVEvents) and POOL.kv_slack == 4
    key = BalanceKey(cached=held(6, b1=5))
    # b1 at 4 of a mean after (5 + 1) / 3 = 2: past ceil(1.5 x 2) = 3, within 2 + 4 = 6.
    kept, spilled = slack.choose(cands(0, 4, 1), key)[1], none.choose(cands(0, 4, 1), key)[1]
    assert kept is not None and spilled is not None
    assert (kept.favourite, kept.reason) == ("b1", "sticky") and spilled.reason == "spill"
    past = slack.choose(cands(0, 9, 1), key)[1]  # 10 > (10 + 1) / 3 + 4
    assert past is not None and past.reason == "spill"
    # A conversation nothing holds: its hash home yields at the plain bound, slack or not.
    new = BalanceKey(anchor=12345, cached=held(6))
    home = slack.choose(cands(0, 0, 0, 0), new)[1]
    assert home is not None and home.reason == "hash"
    loads = [0, 0, 0, 0]
    loads[int(home.favourite[1:])] = 3
    moved = slack.choose(cands(*loads), new)[1]
    assert moved is not None and moved.reason == "spill" and moved.favourite != home.favourite


def test_other_replicas_requests_count_from_the_scrape_ours_from_now() -> None:
    """Two gateway replicas over two engines: the engine's scraped count includes the other
    replica's requests; ours count as they are now, not as the (older) scrape saw them."""
    registry = Registry(parse_config(TWO, env={}))
    b0, b1 = registry.by_name["b0"], registry.by_name["b1"]
    for b in (b0, b1):
        b.healthy = True
    b1.in_flight = 2
    registry.set_load(b1, EngineLoad(running=5.0, waiting=1.0, scraped_at=time.monotonic()))
    b1.in_flight = 0  # ours finished since the scrape; the other replica's 4 are still counted
    b0.in_flight = 3  # b0's scrape is stale: only ours
    registry.set_load(b0, EngineLoad(running=9.0, scraped_at=time.monotonic() - 3600))
    loads = {c.name: kv_load(c) for c in registry.candidates("p", time.monotonic())}
    assert loads == {"b0": 3.0, "b1": 4.0}
    # candidate_load's max would have made b1 look busier than b0 (6 > 3) and spilled its holder.
    assert {c.name: candidate_load(c) for c in registry.candidates("p", time.monotonic())} == {"b0": 3.0, "b1": 6.0}


def test_a_leading_run_match_that_holds_nothing_keeps_the_hash_home_within_the_slack() -> None:
    """Only the system prompt's ids are known (less than a block): nothing is held by what is
    known, which says nothing about the rest of the prompt, so the home keeps its slack; the
    prompt's own ids held nowhere do not."""
    partial = BalanceKey(anchor=12345, cached=CachedPrefix((("b0", 0), ("b1", 0)), 0, whole=False))
    home = balancer().choose(cands(0, 0), partial)[1]
    assert home is not None and home.reason == "hash"
    loads = [0, 0]
    loads[int(home.favourite[1:])] = 4  # 5 > ceil(1.5 x 2.5) = 4, within 2.5 + 4
    kept = balancer().choose(cands(*loads), partial)[1]
    assert kept is not None and (kept.favourite, kept.reason) == (home.favourite, "hash")
    whole = BalanceKey(anchor=12345, cached=CachedPrefix((("b0", 0), ("b1", 0)), 3))
    moved = balancer().choose(cands(*loads), whole)[1]
    assert moved is not None and moved.reason == "spill" and moved.favourite != home.favourite


def test_a_hot_conversation_goes_to_the_less_loaded_of_its_holders() -> None:
    """One conversation with most of the recent requests, held by both backends (all but one block
    on b1): its requests go to the less loaded; a cold conversation held by both stays home."""
    b = balancer()
    hot_key = BalanceKey(anchor=1, cached=held(5, b0=5, b1=4))
    for n in range(40):  # the hot conversation's share of the window: well past a sixth
        b.choose(cands(0, 0), hot_key if n % 2 else BalanceKey(anchor=1000 + n, cached=held(5)))
    for loads, want in (((3, 1), "b1"), ((1, 3), "b0")):
        choice = b.choose(cands(*loads), hot_key)[1]
        assert choice is not None and (choice.favourite, choice.reason) == (want, "sticky"), loads
    cold = BalanceKey(anchor=999_999, cached=held(5, b0=5, b1=5))
    home = balancer().choose(cands(0, 0), BalanceKey(anchor=999_999))[1]
    assert home is not None
    heavy = [0, 0]
    heavy[int(home.favourite[1:])] = 2  # more than the other, within the bound
    choice = b.choose(cands(*heavy), cold)[1]
    assert choice is not None and choice.favourite == home.favourite


def test_a_hot_conversation_gets_no_slack() -> None:
    """Held by b0 alone and past the plain bound: a hot conversation spills (its copy will be
    reused), where a cold one would stay within the slack."""
    b = balancer()
    hot_key = BalanceKey(anchor=1, cached=held(5, b0=5))
    for _ in range(40):
        b.choose(cands(0, 0), hot_key)
    choice = b.choose(cands(4, 0), hot_key)[1]  # 5 > ceil(1.5 x 2.5) = 4
    assert choice is not None and (choice.favourite, choice.reason) == ("b1", "spill")
    cold = balancer().choose(cands(4, 0), BalanceKey(anchor=1, cached=held(5, b0=5)))[1]
    assert cold is not None and (cold.favourite, cold.reason) == ("b0", "sticky")
