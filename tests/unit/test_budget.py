"""Token budgets' arithmetic, with no store: calendar periods in UTC, the refusal rule (used plus
held), and the message a refused client reads."""

from __future__ import annotations

import datetime

import pytest

from gateway.access.budget import exhausted, hold_names, period_of, refusal_of, used_names
from gateway.config import BudgetConfig

pytestmark = pytest.mark.unit


def at(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> float:
    return datetime.datetime(year, month, day, hour, minute, second, tzinfo=datetime.UTC).timestamp()


def test_a_day_and_a_month_start_again_at_midnight_utc() -> None:
    assert period_of("day", at(2026, 12, 3, 23, 59, 59)).label == "d20261203"
    assert period_of("day", at(2026, 12, 3, 23, 59, 59)).resets_at == at(2026, 12, 4)
    assert period_of("day", at(2026, 12, 4)).label == "d20261204"
    assert period_of("month", at(2026, 12, 31, 12)).resets_at == at(2027, 1, 1)  # December rolls the year
    assert period_of("month", at(2027, 2, 10)).resets_at == at(2027, 3, 1)
    assert period_of("month", at(2027, 2, 10)).label == "m202702"


def test_counters_are_per_key_period_and_side_on_one_shard() -> None:
    budget = BudgetConfig(period="day", output_tokens=10)
    name_in, name_out, _ = used_names("gw:", "team", budget, at(2026, 12, 3, 10))
    assert (name_in, name_out) == ("gw:{team}:budget:d20261203:input", "gw:{team}:budget:d20261203:output")
    slot, holds = hold_names("gw:", "team", at(2026, 12, 3, 10))
    assert holds[0].endswith(f":input:{slot}") and holds[1].endswith(f":input:{slot - 1}")
    assert all("{team}" in h for h in holds)


@pytest.mark.parametrize(
    ("used", "held", "expected"),
    [
        ([(0, 99)], (0, 0), None),
        ([(0, 100)], (0, 0), (0, 1, 100)),  # used up exactly: nothing left
        ([(0, 60)], (0, 40), (0, 1, 100)),  # running requests' holds count
        ([(0, 60)], (500, 0), None),  # an input hold on an output-only budget does not
    ],
)
def test_refused_once_used_plus_held_reaches_the_budget(
    used: list[tuple[int, int]], held: tuple[int, int], expected: tuple[int, int, int] | None
) -> None:
    assert exhausted([(None, 100)], used, held) == expected


def test_the_first_used_up_budget_is_named_with_its_reset() -> None:
    budgets = (BudgetConfig(period="day", input_tokens=1000), BudgetConfig(period="month", output_tokens=50))
    found = exhausted([(b.input_tokens, b.output_tokens) for b in budgets], [(10, 0), (0, 51)], (0, 0))
    assert found == (1, 1, 51)
    now = at(2026, 12, 30, 0)
    refusal = refusal_of(budgets, found, now)
    assert (refusal.kind, refusal.used, refusal.limit, refusal.resets_at) == ("output", 51, 50, at(2027, 1, 1))
    assert refusal.message(now) == (
        "This API key's monthly output-token budget is used up: 51 of 50 tokens (requests still running "
        "count). It resets at 2027-01-01T00:00:00Z, in 172800 s."
    )


def test_a_budget_needs_a_limit() -> None:
    with pytest.raises(ValueError, match="input_tokens, output_tokens or both"):
        BudgetConfig(period="day")
