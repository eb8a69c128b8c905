"""gateway bench's workloads: seeded, streamed with usage, fixed output length, agent turns that
resend their history behind one shared system prompt, and JSONL files checked line by line."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from gateway.bench.workload import WorkloadError, WorkloadSpec, bodies

pytestmark = pytest.mark.unit


def take(spec: WorkloadSpec, n: int, model: str | None = "m") -> list[dict[str, Any]]:
    return list(itertools.islice(bodies(spec, model), n))


def test_same_seed_same_bodies_and_every_body_streams_a_fixed_length() -> None:
    spec = WorkloadSpec("chat", prompt_tokens=100, output_tokens=32, seed=3)
    got = take(spec, 20)
    assert got == take(spec, 20)
    assert got != take(WorkloadSpec("chat", 100, 32, seed=4), 20)
    for body in got:
        assert body["model"] == "m" and body["stream"] is True
        assert body["stream_options"] == {"include_usage": True}
        assert body["max_tokens"] == 32 and body["ignore_eos"] is True and body["min_tokens"] == 32
    sizes = [len(b["messages"][0]["content"]) / 4 for b in got]
    assert min(sizes) >= 45 and max(sizes) <= 160 and len(set(sizes)) > 10


def test_no_ignore_eos_sends_neither_field() -> None:
    (body,) = take(WorkloadSpec("chat", ignore_eos=False), 1)
    assert "ignore_eos" not in body and "min_tokens" not in body


def test_long_context_is_near_the_length() -> None:
    for body in take(WorkloadSpec("long-context", prompt_tokens=2000), 10):
        assert 0.9 * 2000 * 4 <= len(body["messages"][0]["content"]) <= 2000 * 4 + 30


def test_agent_turns_share_the_system_prompt_and_resend_history() -> None:
    got = take(WorkloadSpec("agent", prompt_tokens=20, output_tokens=16), 60)
    systems = {json.dumps(b["messages"][0]) for b in got}
    assert len(systems) == 1 and all(b["tools"] for b in got)
    turns = [b["messages"] for b in got]
    follow_ups = [m for m in turns if len(m) > 2]
    assert len(follow_ups) > 20
    for msgs in follow_ups:
        # Each later turn's history is an earlier request's messages plus that turn's answer.
        assert any(earlier == msgs[: len(earlier)] and len(earlier) == len(msgs) - 2 for earlier in turns)


def test_jsonl_bodies_are_cycled_and_given_the_run_settings(tmp_path: Path) -> None:
    f = tmp_path / "mine.jsonl"
    f.write_text('{"messages": [{"role": "user", "content": "a"}], "max_tokens": 5}\n\n{"messages": []}\n')
    got = take(WorkloadSpec(str(f), output_tokens=9), 3, model=None)
    assert [b["max_tokens"] for b in got] == [5, 9, 5]
    assert all(b["stream"] is True for b in got)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": []}\n[1]\n')
    with pytest.raises(WorkloadError, match=r"bad\.jsonl:2"):
        take(WorkloadSpec(str(bad)), 1)


def test_bench_without_its_extra_says_which_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse
    import sys

    from gateway.bench import command

    monkeypatch.setitem(sys.modules, "aiohttp", None)  # as if the extra were not installed
    assert command.run(argparse.Namespace()) == 2
    assert "pip install 'llm-gateway[bench]'" in capsys.readouterr().err
