"""Balancers: put a pool's healthy backends in preference order for one request (least_load,
prefix_affinity, round_robin, session, first_healthy, kv_events). Pure: state is in-object, time is
passed in."""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from hashlib import blake2b
from typing import Protocol

from engines.base import EngineLoad
from gateway.config import BalancerKind, PoolConfig
from gateway.policy.cached_prefix import CachedPrefix, EngineState, KVChoice, Saturation, choose
from gateway.value import value

WAITING_WEIGHT = 1.0
"""least_load: a queued request costs this much on top of the one it already counts for."""
KV_WEIGHT = 2.0
"""least_load: a full KV cache weighs like this many requests (it will queue or preempt soon)."""
SLOW_START_LOAD = 8.0
"""A backend just back from an outage looks this many requests busier, falling linearly to none over
health.slow_start_s: it gets a ramped share, not a full one at once (a cold cache, a warming engine)."""
HOT_WINDOW = 64
"""kv_events: the recent requests over which a conversation's share is counted."""
HOT_SHARE = 1 / 3
"""kv_events: a conversation with this share of the recent requests, over the number of backends,
is hot: copies of it on several backends pay for themselves, and its requests even the load."""
AFFINITY_MAX_ENTRIES = 65_536
"""prefix_affinity: learned block hashes kept (log2(blocks) + 1 per request: ~10k recent prompts)."""
HASH_ORDERS = 65_536
"""Conversations whose hash order KVEvents keeps (two blake2b digests and a sort each time
otherwise, on every request of a kv_events pool); the table is emptied when full."""


@value
class Candidate:
    """A healthy backend as the registry sees it now."""

    name: str
    in_flight: int
    load: EngineLoad | None = None
    load_fresh: bool = False
    max_in_flight: int | None = None
    ramp: float = 1.0
    """Slow start: 0 just after re-admission, 1 once health.slow_start_s has passed."""
    decided: int = 0
    """Requests routed here that have not started their attempt yet (queued for admission, their
    caps being counted): load at decision time, which in_flight counts only from the attempt."""
    in_flight_at_scrape: int = 0
    """in_flight when `load` was scraped: the engine's running + waiting less this is what other
    clients (other gateway replicas among them) had on it then (kv_load)."""


@value
class BalanceKey:
    """What a balancer may know about the request."""

    fingerprint: tuple[int, ...] = ()
    """The prompt's prefix fingerprint (gateway.policy.prefix.fingerprint); empty when not computed."""
    session: str | None = None
    """The session header's value, else the body's `user`; None when the request has neither."""
    anchor: int | None = None
    """A hash of the chat's first non-system message: the conversation's identity (prefix.Anchor)."""
    anchor_block: int = 0
    """The first fingerprint block past the shared head (system prompt and tools)."""
    cached: CachedPrefix | None = None
    """kv_events: the prompt's blocks each backend's KV events say it holds; None when not computed."""


class Balancer(Protocol):
    def order(self, candidates: Sequence[Candidate], key: BalanceKey) -> list[Candidate]:
        """All candidates, best first; the proxy takes the first and retries on the next."""
        ...

    def decide(self, candidates: Sequence[Candidate], key: BalanceKey) -> tuple[list[Candidate], str | None]:
        """order(), and the backend the balancer's memory names for this key (None: no memory)."""
        ...

    def learn(self, fingerprint: tuple[int, ...], backend: str, now: float, home: str | None = None) -> None:
        """Called once with the backend that served a request (its first byte arrived), and the
        `home` that decide() named for it; a no-op except for prefix_affinity."""
        ...


class _NoMemory:
    """For the balancers that remember nothing about where requests went."""

    def order(self, candidates: Sequence[Candidate], key: BalanceKey) -> list[Candidate]:
        raise NotImplementedError

    def decide(self, candidates: Sequence[Candidate], key: BalanceKey) -> tuple[list[Candidate], str | None]:
        return self.order(candidates, key), None

    def learn(self, fingerprint: tuple[int, ...], backend: str, now: float, home: str | None = None) -> None:
        return None


def _ramp_load(c: Candidate) -> float:
    """Slow start's extra load (SLOW_START_LOAD)."""
    return SLOW_START_LOAD * (1.0 - c.ramp) if c.ramp < 1.0 else 0.0


def candidate_load(c: Candidate) -> float:
    """Requests on the backend: ours in flight or, when the scrape is fresh, what the engine reports
    running and waiting if that is more. A max, not a sum: the engine's count already includes ours,
    and summing would make a backend with a stale scrape look half as busy as a fresh one."""
    ramp = _ramp_load(c)
    if c.load_fresh and c.load is not None:
        engine = (c.load.running or 0.0) + (c.load.waiting or 0.0)
        return max(float(c.in_flight), engine) + ramp
    return float(c.in_flight) + ramp


def least_load_score(c: Candidate) -> float:
    score = candidate_load(c)
    if c.load_fresh and c.load is not None:
        score += WAITING_WEIGHT * (c.load.waiting or 0.0) + KV_WEIGHT * (c.load.kv_usage or 0.0)
    return score


def _saturated_last(ordered: list[Candidate]) -> list[Candidate]:
    """Backends at their `max_in_flight` keep their relative order but go after every other one."""
    full = [c for c in ordered if c.max_in_flight is not None and c.in_flight >= c.max_in_flight]
    if not full:
        return ordered
    return [c for c in ordered if not (c.max_in_flight is not None and c.in_flight >= c.max_in_flight)] + full


def rendezvous(key: bytes, candidates: Sequence[Candidate]) -> list[Candidate]:
    """Highest-random-weight order of candidates for `key`: every replica computes the same order, and
    removing a backend only moves the keys it had."""
    return sorted(
        candidates,
        key=lambda c: (blake2b(key + b"\x00" + c.name.encode(), digest_size=8).digest(), c.name),
        reverse=True,
    )


class LeastLoad(_NoMemory):
    def order(self, candidates: Sequence[Candidate], key: BalanceKey) -> list[Candidate]:
        if len(candidates) < 2:
            return list(candidates)
        return _saturated_last(sorted(candidates, key=lambda c: (least_load_score(c), c.name)))


class RoundRobin(_NoMemory):
    def __init__(self) -> None:
        self._next = 0

    def order(self, candidates: Sequence[Candidate], key: BalanceKey) -> list[Candidate]:
        if not candidates:
            return []
        start = self._next % len(candidates)
        self._next += 1
        return _saturated_last([*candidates[start:], *candidates[:start]])


class Session(_NoMemory):
    """Sticky by session key (a header or the body's `user`); least_load for requests without one."""

    def order(self, candidates: Sequence[Candidate], key: BalanceKey) -> list[Candidate]:
        if key.session is None:
            return LeastLoad().order(candidates, key)
        return _saturated_last(rendezvous(key.session.encode("utf-8", "surrogatepass"), candidates))


class FirstHealthy(_NoMemory):
    def order(self, candidates: Sequence[Candidate], key: BalanceKey) -> list[Candidate]:
        return _saturated_last(list(candidates))


class PrefixAffinity:
    """The backend most likely to hold the prompt's prefix in its KV cache: the longest fingerprint
    match learned from where earlier requests went, else a rendezvous hash of the first block (so cold
    replicas agree). Bounded by load (consistent hashing with bounded loads): a favourite that would go
    past ceil((1+epsilon) x the mean load after this request) yields to the least-loaded backend.

    Why the least-loaded and not the next rendezvous choice: with one hot prefix (an agent's system
    prompt), walking the rendezvous order fills n/(1+epsilon) backends to the bound and leaves the rest
    idle (1 of 8 at epsilon 0.25), for the same worst case and no better prefix reuse."""

    def __init__(self, epsilon: float, max_entries: int = AFFINITY_MAX_ENTRIES, slack: int = 0) -> None:
        self._epsilon = epsilon
        self._slack = slack
        self._max_entries = max_entries
        self._table: OrderedDict[int, tuple[str, int]] = OrderedDict()
        """block hash -> (backend, the block's index in the fingerprint)"""

    def __len__(self) -> int:
        return len(self._table)

    def order(self, candidates: Sequence[Candidate], key: BalanceKey) -> list[Candidate]:
        return self.decide(candidates, key)[0]

    def decide(self, candidates: Sequence[Candidate], key: BalanceKey) -> tuple[list[Candidate], str | None]:
        """The order, and the conversation's learned home when a learned match chose the favourite."""
        fp = key.fingerprint
        if not fp or not candidates:
            return LeastLoad().order(candidates, key), None
        # A conversation's identity is its first non-system message, not block 0: agents share a
        # long system prompt and tools, and hashing those would send every conversation to one place.
        seed = key.anchor if key.anchor is not None else fp[0]
        preferred = rendezvous(seed.to_bytes(8, "big"), candidates)
        learned = self._lookup(fp, {c.name for c in candidates}, key.anchor_block)
        if learned is not None:
            preferred.sort(key=lambda c: c.name != learned)  # stable: the rest keep rendezvous order
        loads = {c.name: candidate_load(c) for c in preferred}
        mean_after = (sum(loads.values()) + 1.0) / len(loads)
        capacity = max(math.ceil((1.0 + self._epsilon) * mean_after), mean_after + self._slack)
        favourite = preferred[0]
        # Retries and spills go to the least loaded; equal loads keep the preference order (stable).
        if loads[favourite.name] + 1.0 <= capacity:
            ordered = [favourite, *sorted(preferred[1:], key=lambda c: loads[c.name])]
        else:
            ordered = sorted(preferred, key=lambda c: loads[c.name])
        return _saturated_last(ordered), favourite.name if learned is not None else None

    def learn(self, fingerprint: tuple[int, ...], backend: str, now: float, home: str | None = None) -> None:
        """Remember `backend` for the request's last block and for blocks 1, 2, 4, 8... so a later
        request finds its longest shared prefix to within a factor of two, at ~log2(n) entries per
        request. LRU-bounded, not timed: a stale entry is no worse than the rendezvous guess.

        A request that spilled under load away from where its conversation was learned to be is not
        learned: that cache stays where it was, and re-homing on every spill made conversations drift.
        (A first turn that spilled off its cold-start choice is learned where it ran.) `home` is what
        decide() named for this request: an explicit input, not state kept between the two calls."""
        n = len(fingerprint)
        if not n:
            return
        if home is not None and home != backend:
            return
        table = self._table
        index = 0
        while index < n - 1:
            table[fingerprint[index]] = (backend, index)
            table.move_to_end(fingerprint[index])
            index = 2 * index + 1
        table[fingerprint[-1]] = (backend, n - 1)
        table.move_to_end(fingerprint[-1])
        while len(table) > self._max_entries:
            table.popitem(last=False)

    def _lookup(self, fp: tuple[int, ...], names: set[str], floor: int = 0) -> str | None:
        """The backend learned for the longest prefix of `fp`, among `names`; only a match that
        reaches block `floor` (into the conversation's own text) counts as the same conversation."""
        table = self._table
        best, best_index = None, floor - 1
        for h in table.keys() & fp:  # one C-level pass over the fingerprint
            name, index = table[h]
            if index > best_index and index < len(fp) and fp[index] == h and name in names:
                best, best_index = name, index
        return best


class KVEvents(_NoMemory):
    """From what the engines report they cache (gateway.policy.cached_prefix): the longest cached
    prefix while its backend is not saturated, else the least loaded; with nothing cached, a
    rendezvous hash of the conversation under the same load bound. Loads include requests decided
    and not yet started, so that a burst decided together spreads instead of landing on one
    backend. Every replica that hears the same events decides the same (up to load). It keeps the
    conversation keys of its last `window` requests, so that a hot conversation (HOT_SHARE) is
    spread by load over the backends holding it while the others stay where their prefix is."""

    def __init__(self, saturation: Saturation, window: int = HOT_WINDOW) -> None:
        self._saturation = saturation
        self._window = window
        self._recent: deque[bytes] = deque()
        """The conversation keys of the last `window` requests, oldest first."""
        self._counts: dict[bytes, int] = {}
        """Conversation key -> its requests among `_recent` (a plain dict: Counter's methods are
        Python, and this runs for every request)."""
        self._orders: dict[bytes, tuple[tuple[str, ...], list[str]]] = {}
        """Conversation key -> (the candidates' names, their rendezvous order for it)."""

    def order(self, candidates: Sequence[Candidate], key: BalanceKey) -> list[Candidate]:
        return self.choose(candidates, key)[0]

    def _hashed(self, seed: bytes, candidates: Sequence[Candidate]) -> list[str]:
        """The candidates' names in the rendezvous order for `seed`, from the table while the
        candidates are the same."""
        names = tuple([c.name for c in candidates])
        found = self._orders.get(seed)
        if found is not None and found[0] == names:
            return found[1]
        if len(self._orders) >= HASH_ORDERS:
            self._orders.clear()
        order = [c.name for c in rendezvous(seed, candidates)]
        self._orders[seed] = (names, order)
        return order

    def choose(self, candidates: Sequence[Candidate], key: BalanceKey) -> tuple[list[Candidate], KVChoice | None]:
        """The order, and the decision with its explanation (None: no candidates). Runs for every
        request of a kv_events pool: plain loops, no generator or sort on the two-backend path."""
        if not candidates:
            return [], None
        states = [_state(c) for c in candidates]
        seed = _hash_seed(key)
        hashed = self._hashed(seed, candidates) if seed is not None else []
        hot = seed is not None and self._hot(seed, len(candidates))
        choice = choose(states, hashed, key.cached, self._saturation, hot)
        pick = choice.favourite
        first = candidates[0]
        for c in candidates:
            if c.name == pick:
                first = c
                break
        if len(candidates) == 2:
            rest = [candidates[1] if first is candidates[0] else candidates[0]]
        else:
            loads = {s.name: s.load for s in states}
            rest = sorted((c for c in candidates if c is not first), key=lambda c: (loads[c.name], c.name))
        return _saturated_last([first, *rest]), choice

    def _hot(self, seed: bytes, backends: int) -> bool:
        """Count the request; whether its conversation has at least HOT_SHARE / backends of the
        recent requests (with 2 backends: a sixth)."""
        recent, counts = self._recent, self._counts
        recent.append(seed)
        count = counts[seed] = counts.get(seed, 0) + 1
        if len(recent) > self._window:
            old = recent.popleft()
            left = counts[old] - 1
            if left:
                counts[old] = left
            else:
                del counts[old]
            if old == seed:
                count -= 1
        return count * backends >= HOT_SHARE * max(len(recent), self._window // 2)


def kv_load(c: Candidate) -> float:
    """kv_events' load: this gateway's requests now (in flight and decided), plus what others had on
    the engine at the last fresh scrape. Not candidate_load's max: with several gateway replicas,
    one backend's fresh scrape counts every replica's requests while another's stale one counts
    this replica's alone, and the max compared the two (a holder looked twice as busy as it was
    and spilled)."""
    external = 0.0
    if c.load_fresh and c.load is not None:
        engine = (c.load.running or 0.0) + (c.load.waiting or 0.0)
        external = max(0.0, engine - c.in_flight_at_scrape)
    return float(c.in_flight) + c.decided + external + _ramp_load(c)


def _state(c: Candidate) -> EngineState:
    if not c.load_fresh and c.ramp >= 1.0:  # most requests: no fresh scrape, no slow start (kv_load)
        return EngineState(c.name, float(c.in_flight) + c.decided)
    load = kv_load(c)
    if c.load_fresh and c.load is not None:
        return EngineState(c.name, load, c.load.waiting, c.load.kv_usage)
    return EngineState(c.name, load)


def _hash_seed(key: BalanceKey) -> bytes | None:
    """The conversation's identity for the fallback hash: its anchor, else its session, else the
    prompt's first block."""
    if key.anchor is not None:
        return key.anchor.to_bytes(8, "big")
    if key.session is not None:
        return key.session.encode("utf-8", "surrogatepass")
    if key.fingerprint:
        return key.fingerprint[0].to_bytes(8, "big")
    return None


def make_balancer(kind: BalancerKind, pool: PoolConfig) -> Balancer:
    if kind == "least_load":
        return LeastLoad()
    if kind == "prefix_affinity":
        return PrefixAffinity(pool.affinity_epsilon, slack=pool.affinity_slack)
    if kind == "round_robin":
        return RoundRobin()
    if kind == "session":
        return Session()
    if kind == "first_healthy":
        return FirstHealthy()
    if kind == "kv_events":
        return KVEvents(
            Saturation(pool.kv_epsilon, pool.kv_slack, pool.kv_saturation_waiting, pool.kv_saturation_kv_usage)
        )
    raise ValueError(f"unknown balancer {kind!r}")
