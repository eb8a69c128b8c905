"""The kv_events decision: the backend whose KV cache (as its own events report it) holds the longest
prefix of the prompt, kept while it is not saturated, else the one with room holding the most of it
(then the least loaded); a bounded-load consistent hash when no backend holds any of it. Loads
count requests already decided. Pure: the cache's state arrives as a snapshot of matched blocks per
backend, the loads as numbers."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from gateway.value import value


@value
class PromptIds:
    """The token ids to match a prompt with (pipeline/prompt_tokens.py)."""

    ids: Sequence[int]
    whole: bool
    """The prompt's own ids; false: a leading run's (an earlier turn, or the system prompt alone),
    past which the prompt is not known."""


@value
class CachedPrefix:
    """What the engines' KV events say about one prompt, at decision time."""

    blocks: tuple[tuple[str, int], ...]
    """(backend, leading blocks of the prompt it holds), for the backends that stream events."""
    prompt_blocks: int
    """Full blocks in the prompt (at the engines' block size)."""
    block_sizes: tuple[tuple[str, int], ...] = ()
    """(backend, its engine's block size in tokens), for the same backends."""
    whole: bool = True
    """Matched from the prompt's own ids; false: from a leading run's, so a backend may hold more
    of the prompt than `blocks` says."""

    def tokens(self, name: str) -> int | None:
        """The prompt tokens `name` holds by its events (None: it streams none)."""
        for backend, size in self.block_sizes:
            if backend == name:
                for holder, held in self.blocks:
                    if holder == name:
                        return held * size
                return 0
        return None


@value
class PromptBlocks:
    """A prompt's match (`cached`) and its block keys by block size, to note where it was routed."""

    cached: CachedPrefix
    keys: Mapping[int, Sequence[int]]


@value
class Saturation:
    """When a backend stops taking requests for its cache's sake (any one suffices)."""

    epsilon: float = 0.5
    """Bounded load: past ceil((1 + epsilon) x the mean load after this request)."""
    slack: int = 4
    """A backend holding the prompt's longest cached prefix may also run this many requests above
    the mean load (as prefix_affinity's affinity_slack): fewer spills, and so fewer prefixes copied,
    for a less even load (docs/routing-benchmark.md measures both). So may the conversation's hash
    home when this gateway does not know the prompt's ids yet."""
    waiting: int | None = None
    """The engine's own queue (a fresh scrape) reached this many requests (None: not consulted)."""
    kv_usage: float | None = None
    """The engine's KV cache (a fresh scrape) is this full: what it holds is about to be evicted
    (None: not consulted)."""


@value
class EngineState:
    name: str
    load: float
    """Requests on it, those decided and not yet started included."""
    waiting: float | None = None
    kv_usage: float | None = None
    """From a fresh scrape only; None when stale or never scraped."""


@value
class KVChoice:
    favourite: str
    reason: str
    """`sticky` (the longest cached prefix), `spill` (that backend is saturated: of those with room,
    the one holding the most, then the least loaded),
    `hash` (nothing cached anywhere: the bounded-load hash choice) or `least_load` (no key)."""
    explanation: str
    """One line for x-gateway-balancer: the reason, the choice, matched blocks and loads per backend."""


def bound(loads: Sequence[float], epsilon: float, slack: int = 0) -> float:
    """The most a backend may carry after this request: (1 + epsilon) x the mean, rounded up, or
    the mean plus `slack`, whichever is more."""
    return bound_of(sum(loads), len(loads), epsilon, slack)


def signalled(state: EngineState, sat: Saturation) -> bool:
    """The engine's own scrape says it is saturated (its queue, or its KV cache's use). The
    decision also asks that the backend carry more than the mean load (choose())."""
    if sat.waiting is not None and state.waiting is not None and state.waiting >= sat.waiting:
        return True
    return sat.kv_usage is not None and state.kv_usage is not None and state.kv_usage >= sat.kv_usage


def choose(
    states: Sequence[EngineState],
    hashed: Sequence[str],
    cached: CachedPrefix | None,
    sat: Saturation,
    hot: bool = False,
) -> KVChoice:
    """`states` non-empty; `hashed` the same names in the consistent hash's order for this request
    (empty when the request has no key to hash); `hot`: the conversation carries a large share of
    the pool's recent requests (KVEvents). Runs for every request of a kv_events pool, so it is
    written for the interpreter: no closures, and the lists below are built only on the branch
    that needs them (3 to 5 µs a decision with two backends, docs/routing.md)."""
    n = len(states)
    total = 0.0
    for s in states:
        total += s.load
    mean = (total + 1.0) / n
    limit = float(math.ceil((1.0 + sat.epsilon) * mean))  # bound_of(total, n, epsilon), inlined
    if limit < mean:
        limit = mean
    keep = max(limit, mean + sat.slack)  # what a holder of the prompt may carry: bound_of's slack
    busy: frozenset[str] = frozenset()
    if sat.waiting is not None or sat.kv_usage is not None:  # the signals are off by default
        # Saturated: the engine says so in a fresh scrape AND it carries more than the mean load now.
        # A scrape is up to scrape_interval_s old; alone it moved conversations off holders that had
        # drained since (each move a full prefill elsewhere and a copy of the prefix). Every engine
        # reporting a queue or a full cache: moving the request shortens no queue, and a cached
        # prefix still saves its prefill, so only the load bound applies.
        flagged = [s for s in states if signalled(s, sat)]
        if flagged and len(flagged) < n:
            mean_now = total / n
            busy = frozenset([s.name for s in flagged if s.load > mean_now])
    matched: dict[str, int] = {}  # the backends holding any of it: most requests match nothing
    if cached is not None:
        for name, held in cached.blocks:
            if held:
                matched[name] = held
    best = max([matched.get(s.name, 0) for s in states]) if matched else 0
    if best > 0:
        if not hot:
            # Of the backends with room holding the longest prefix, the first in the conversation's
            # hash order (its home), then the least loaded: a conversation that spilled once goes
            # back home while there is room, and the copy elsewhere ages out instead of being kept
            # warm by turns that alternate between the two.
            holders = [
                s for s in states if matched.get(s.name, 0) == best and s.load + 1.0 <= keep and s.name not in busy
            ]
            if len(holders) == 1:  # most sticky requests: one backend holds the longest prefix
                return _choice(holders[0].name, "sticky", states, matched, cached)
            if holders:
                rank = {name: i for i, name in enumerate(hashed)}
                last = len(rank)
                home = min(holders, key=lambda s: (rank.get(s.name, last), s.load, s.name))
                return _choice(home.name, "sticky", states, matched, cached)
        open_ = [s for s in states if s.load + 1.0 <= limit and s.name not in busy]
        if hot:
            # A hot conversation is worth a copy on every backend it needs: its requests go to the
            # least loaded backend holding all but at most one block of its prefix, under the plain
            # bound (no slack), so its traffic evens the load; past that bound it spills and the
            # copy it makes is reused by its next requests.
            near = [s for s in open_ if matched.get(s.name, 0) >= best - 1]
            if len(near) == 1:
                return _choice(near[0].name, "sticky", states, matched, cached)
            if near:
                rank = {name: i for i, name in enumerate(hashed)}
                last = len(rank)
                pick = min(near, key=lambda s: (s.load, -matched.get(s.name, 0), rank.get(s.name, last), s.name))
                return _choice(pick.name, "sticky", states, matched, cached)
        if open_:
            # The holders are saturated: of those with room, the one holding the most of the prompt
            # (a partial holder still saves its blocks' prefill), then the least loaded.
            pick = min(open_, key=lambda s: (-matched.get(s.name, 0), s.load, s.name))
            return _choice(pick.name, "spill", states, matched, cached)
        return _choice(_least(states, limit, busy, matched), "spill", states, matched, cached)
    if hashed:
        # No engine holds any of it (or its ids are not known): the conversation's hash home, which
        # every replica computes alike, so that replicas agree on a new conversation's home and a
        # replica that has not seen the conversation guesses where the others sent it. Ids not known
        # yet, or known only for a leading run such as the system prompt (another gateway replica
        # served the conversation's earlier turns, or this one is still asking them), most often
        # mean a conversation that lives at its home: it keeps the holder's slack. The prompt's own
        # ids held nowhere mean a new or evicted conversation: no slack, so that new conversations
        # spread the load.
        first = hashed[0]
        for s in states:
            if s.name == first:
                cap = limit if cached is not None and cached.whole else keep
                if s.load + 1.0 <= cap and first not in busy:
                    return _choice(first, "hash", states, matched, cached)
                break
        return _choice(_least(states, limit, busy, matched), "spill", states, matched, cached)
    return _choice(_least(states, limit, busy, matched), "least_load", states, matched, cached)


def bound_of(total: float, n: int, epsilon: float, slack: int = 0) -> float:
    """bound() from the loads' sum and count."""
    mean = (total + 1.0) / n
    return max(math.ceil((1.0 + epsilon) * mean), mean + slack)


def _least(states: Sequence[EngineState], limit: float, busy: frozenset[str], matched: Mapping[str, int]) -> str:
    """The least loaded backend with room (of all when none has), then the one holding the most."""
    best: EngineState | None = None
    for s in states:
        if s.load + 1.0 <= limit and s.name not in busy and (best is None or _before(s, best, matched)):
            best = s
    if best is None:
        for s in states:
            if best is None or _before(s, best, matched):
                best = s
    assert best is not None
    return best.name


def _before(a: EngineState, b: EngineState, matched: Mapping[str, int]) -> bool:
    """`a` goes before `b` in _least's order: less loaded, then holding more, then by name."""
    if a.load != b.load:
        return a.load < b.load
    ma, mb = matched.get(a.name, 0), matched.get(b.name, 0)
    return ma > mb if ma != mb else a.name < b.name


def _choice(
    pick: str, reason: str, states: Sequence[EngineState], matched: Mapping[str, int], cached: CachedPrefix | None
) -> KVChoice:
    return KVChoice(pick, reason, _explain(pick, reason, states, matched, cached))


def _explain(
    pick: str, reason: str, states: Sequence[EngineState], matched: Mapping[str, int], cached: CachedPrefix | None
) -> str:
    blocks, loads = [], []
    for s in states:
        name, load = s.name, s.load
        blocks.append(f"{name}:{matched.get(name, 0)}")
        loads.append(f"{name}:{load:g}")
    total = cached.prompt_blocks if cached is not None else 0
    return f"kv_events {reason} {pick}; blocks {','.join(blocks)} of {total}; load {','.join(loads)}"
