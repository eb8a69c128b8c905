"""Prometheus text exposition to EngineLoad: a cheap reader that keeps only the few names a table asks for.

It runs on every scrape (about once a second per backend), so it is one pass over the lines, no regex.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from engines.base import EngineLoad


class Series(NamedTuple):
    """Every sample of one name, over all its label sets."""

    total: float
    n: int

    @property
    def mean(self) -> float:
        return self.total / self.n


def read_samples(text: str, names: Collection[str]) -> dict[str, Series]:
    """Sum and count the samples of each wanted name; absent names are absent from the result.

    Comment lines (HELP, TYPE, EOF), unwanted names, malformed lines and NaN values are skipped. An
    optional timestamp after the value is ignored.
    """
    totals: dict[str, float] = {}
    counts: dict[str, int] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        end = len(line)
        for sep in "{ \t":
            i = line.find(sep, 0, end)
            if i != -1:
                end = i
        name = line[:end]
        if name not in names:
            continue
        rest = line[end:]
        if rest[:1] == "{":
            # Values and timestamps never hold "}", so the last one closes the label set even when
            # a label value contains "}" itself.
            close = rest.rfind("}")
            if close == -1:
                continue
            rest = rest[close + 1 :]
        fields = rest.split()
        if not fields:
            continue
        try:
            value = float(fields[0])  # also takes "NaN", "+Inf", "1e+03"
        except ValueError:
            continue
        if value != value:  # NaN: the engine doesn't know yet, so neither do we
            continue
        totals[name] = totals.get(name, 0.0) + value
        counts[name] = counts.get(name, 0) + 1
    return {name: Series(total, counts[name]) for name, total in totals.items()}


Labels = frozenset[tuple[str, str]]
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def _labels(text: str, start: int) -> tuple[Labels, int] | None:
    """The label set opening at text[start] ("{"), and the index after its "}"; None if malformed."""
    out: list[tuple[str, str]] = []
    i = start + 1
    while True:
        while i < len(text) and text[i] in " ,":
            i += 1
        if i < len(text) and text[i] == "}":
            return frozenset(out), i + 1
        eq = text.find("=", i)
        if eq == -1 or eq + 1 >= len(text) or text[eq + 1] != '"':
            return None
        name = text[i:eq].strip()
        value: list[str] = []
        j = eq + 2
        while j < len(text) and text[j] != '"':
            if text[j] == "\\" and j + 1 < len(text):
                value.append(_ESCAPES.get(text[j + 1], "\\" + text[j + 1]))
                j += 2
            else:
                value.append(text[j])
                j += 1
        if j >= len(text):
            return None
        out.append((name, "".join(value)))
        i = j + 1


def read_labelled(text: str) -> dict[tuple[str, Labels], float]:
    """Every sample with its label set: (name, labels) -> value, for readers that need the labels
    (`gateway bench`'s scrapes). The text format's escapes in label values are decoded; comment and
    malformed lines are skipped; NaN is kept (a reader of deltas decides)."""
    out: dict[tuple[str, Labels], float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        space = min((i for i in (line.find(" "), line.find("\t")) if i != -1), default=-1)
        labels: Labels = frozenset()
        if brace != -1 and (space == -1 or brace < space):
            name = line[:brace]
            parsed = _labels(line, brace)
            if parsed is None:
                continue
            labels, end = parsed
            rest = line[end:]
        elif space != -1:
            name, rest = line[:space], line[space:]
        else:
            continue
        fields = rest.split()
        if not name or not fields:
            continue
        try:
            out[(name, labels)] = float(fields[0])
        except ValueError:
            continue
    return out


@dataclass(frozen=True, slots=True)
class Ratio:
    """A cumulative rate from two counters: hits / base, or hits / (hits + base) when base excludes hits."""

    hits: str
    base: str
    base_includes_hits: bool = True


def _first(samples: Mapping[str, Series], names: Sequence[str]) -> Series | None:
    for name in names:
        if name in samples:
            return samples[name]
    return None


def _fraction(series: Series | None) -> float | None:
    """The mean as a 0..1 value; a negative one is the engine's "not enabled" (vLLM V0 sends -1)."""
    if series is None or series.mean < 0:
        return None
    return min(1.0, series.mean)


@dataclass(frozen=True, slots=True)
class LoadTable:
    """The engine's metric names for each EngineLoad signal. In each tuple the first name present wins,
    so a renamed metric is its new name followed by its old ones.

    Counts are summed over label sets (vLLM labels every sample with model_name and engine);
    fractions are averaged, because the sum of two engines' KV usage means nothing.
    """

    running: tuple[str, ...] = ()
    waiting: tuple[str, ...] = ()
    kv_usage: tuple[str, ...] = ()
    hit_ratios: tuple[Ratio, ...] = ()
    hit_rate: tuple[str, ...] = ()
    """Gauges used only when no hit ratio's counters are there."""
    wanted: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        names = {*self.running, *self.waiting, *self.kv_usage, *self.hit_rate}
        names.update(n for r in self.hit_ratios for n in (r.hits, r.base))
        object.__setattr__(self, "wanted", frozenset(names))

    def merge(self, other: LoadTable) -> LoadTable:
        return LoadTable(
            running=self.running + other.running,
            waiting=self.waiting + other.waiting,
            kv_usage=self.kv_usage + other.kv_usage,
            hit_ratios=self.hit_ratios + other.hit_ratios,
            hit_rate=self.hit_rate + other.hit_rate,
        )

    def parse(self, text: str, now: float) -> EngineLoad:
        if not self.wanted:
            return EngineLoad(scraped_at=now)
        samples = read_samples(text, self.wanted)
        running = _first(samples, self.running)
        waiting = _first(samples, self.waiting)
        return EngineLoad(
            running=running.total if running is not None else None,
            waiting=waiting.total if waiting is not None else None,
            kv_usage=_fraction(_first(samples, self.kv_usage)),
            prefix_hit_rate=self._hit_rate(samples),
            scraped_at=now,
        )

    def _hit_rate(self, samples: Mapping[str, Series]) -> float | None:
        for ratio in self.hit_ratios:
            hits, base = samples.get(ratio.hits), samples.get(ratio.base)
            if hits is None or base is None:
                continue
            queries = base.total if ratio.base_includes_hits else base.total + hits.total
            if queries > 0 and hits.total >= 0:
                return min(1.0, hits.total / queries)
        return _fraction(_first(samples, self.hit_rate))
