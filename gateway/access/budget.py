"""Token budgets per key over calendar periods (a UTC day or month), as pure arithmetic: the
period a moment falls in and when it resets, the store keys of a key's counters, and the refusal
for a budget that is used up. No I/O: the gate passes `now` and the counts (memory or Redis).

What counts: the engine's reported usage when a request ends (prompt tokens as input, completion
tokens as output), else the gateway's own counts. While a request runs it holds its estimate
(prompt estimate as input, its output budget as output) against every budget of its key, so that
requests admitted together, on any replica, cannot all spend the same remaining tokens: a request
is refused once used + held reaches the budget, and the total passes it by at most the last
admitted request's tokens."""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass

from gateway.config import BudgetConfig

HOLD_SLOT_S = 600
"""Holds live in ten-minute slots (the current and the previous one count): a hold that its
gateway never released (it crashed) is gone within twenty minutes."""


@dataclass(frozen=True, slots=True)
class Period:
    label: str
    """`d20261203` or `m202612`: part of the counter's name, so a new period starts at zero."""
    resets_at: float
    """Unix time the period ends."""


def period_of(kind: str, now: float) -> Period:
    """The UTC day or month that `now` (Unix time) falls in."""
    at = datetime.datetime.fromtimestamp(now, datetime.UTC)
    if kind == "day":
        start = at.replace(hour=0, minute=0, second=0, microsecond=0)
        return Period(f"d{at:%Y%m%d}", (start + datetime.timedelta(days=1)).timestamp())
    first = at.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    if first.month == 12:
        following = first.replace(year=first.year + 1, month=1)
    else:
        following = first.replace(month=first.month + 1)
    return Period(f"m{at:%Y%m}", following.timestamp())


def used_names(prefix: str, key: str, budget: BudgetConfig, now: float) -> tuple[str, str, Period]:
    """The store keys of a key's input and output counters for this budget's current period. The
    key's name in braces is a Redis Cluster hash tag: every counter of one key lives on one shard."""
    period = period_of(budget.period, now)
    base = f"{prefix}{{{key}}}:budget:{period.label}"
    return f"{base}:input", f"{base}:output", period


def hold_names(prefix: str, key: str, now: float) -> tuple[int, Holds]:
    """The current hold slot, and the store keys of a key's held input and output tokens in it and
    in the slot before (input now, input before, output now, output before)."""
    slot = math.floor(now / HOLD_SLOT_S)
    names = tuple(f"{prefix}{{{key}}}:held:{kind}:{s}" for kind in ("input", "output") for s in (slot, slot - 1))
    return slot, (names[0], names[1], names[2], names[3])


def hold_name(prefix: str, key: str, kind: str, slot: int) -> str:
    return f"{prefix}{{{key}}}:held:{kind}:{slot}"


Holds = tuple[str, str, str, str]
"""A key's hold counters: input in this slot, input in the one before, output now, output before."""

Limits = tuple[int | None, int | None]
"""A budget's (input, output) token limits; None: that side is not limited."""


def exhausted(limits: list[Limits], used: list[tuple[int, int]], held: tuple[int, int]) -> tuple[int, int, int] | None:
    """The first budget with nothing left, counting what running requests hold, as (its index, 0
    for input or 1 for output, used + held); None: the request may go. (The Redis store runs the
    same rule in its script, atomically with taking the hold.)"""
    for i, ((lim_in, lim_out), (used_in, used_out)) in enumerate(zip(limits, used, strict=True)):
        if lim_in is not None and used_in + held[0] >= lim_in:
            return i, 0, used_in + held[0]
        if lim_out is not None and used_out + held[1] >= lim_out:
            return i, 1, used_out + held[1]
    return None


@dataclass(frozen=True, slots=True)
class Refusal:
    budget: BudgetConfig
    kind: str
    """`input` or `output`: which of the budget's limits is used up."""
    used: int
    limit: int
    resets_at: float

    def message(self, now: float) -> str:
        per = "daily" if self.budget.period == "day" else "monthly"
        at = datetime.datetime.fromtimestamp(self.resets_at, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return (
            f"This API key's {per} {self.kind}-token budget is used up: {self.used} of {self.limit} tokens "
            f"(requests still running count). It resets at {at}, in {max(1, round(self.resets_at - now))} s."
        )


def refusal_of(budgets: tuple[BudgetConfig, ...], found: tuple[int, int, int], now: float) -> Refusal:
    index, side, used = found
    budget = budgets[index]
    limit = budget.input_tokens if side == 0 else budget.output_tokens
    assert limit is not None
    return Refusal(budget, "input" if side == 0 else "output", used, limit, period_of(budget.period, now).resets_at)
