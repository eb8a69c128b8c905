"""gateway bench end to end against simulated engines behind a real gateway (a few seconds): the
bench's token totals equal the gateway's own counters, no stream loses an event, and the command
writes bench.json in the shape docs/bench.md gives, bench.csv and bench.png."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from gateway.bench import chart
from gateway.bench.command import main
from gateway.bench.levels import Level, Plan, Runner, Target
from gateway.bench.workload import WorkloadSpec
from tests.live.conftest import StackFactory, sim_params

pytestmark = pytest.mark.live


async def test_token_totals_equal_the_gateways_counters(make_stack: StackFactory) -> None:
    stack = await make_stack(pools={"vllm": [sim_params(), sim_params()]})
    plan = Plan(
        levels=[Level(concurrency=1), Level(concurrency=4), Level(rate=50.0)],
        workload=WorkloadSpec("agent", prompt_tokens=20, output_tokens=12, seed=1),
        requests=8, duration_s=None, warmup=1, rounds=1, api_key=None,
    )  # fmt: skip
    engines = [sim.base_url for sim in stack.sims.values()]
    levels = await Runner(plan, [Target("", stack.base_url, "tiny", engines)]).run(lambda *_: None, lambda *_: None)
    assert [(lv["concurrency"], lv["rate"], lv["requests"]) for lv in levels] == [
        (1, None, 8),
        (4, None, 8),
        (None, 50.0, 8),
    ]
    for lv in levels:
        assert lv["errors"] == {}
        assert lv["stream_check"] == {"lost_events": 0, "merged_chunks": 0, "tokens_counted": 96, "tokens_reported": 96}
        assert lv["agreement"]["tokens_equal"], lv["agreement"]
        assert lv["gateway"]["requests"] == 8
    # The gateway's own registry, read directly: warm-up requests included (1 per level).
    bench_out = sum(lv["tokens"]["output"] for lv in levels) + 3 * 12
    bench_prompt = sum(lv["tokens"]["prompt"] for lv in levels)
    assert stack.total("gateway_output_tokens_total") == bench_out
    assert stack.total("gateway_requests_total", outcome="success") == 3 * 8 + 3
    assert stack.total("gateway_prompt_tokens_total") > bench_prompt  # plus the warm-up prompts
    # The agent workload resends history: the engines found part of the prompts cached.
    assert levels[1]["prefix_hit_rate"] > 0


def test_the_command_writes_json_in_the_documented_shape_csv_and_png(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    args = ["--simulate", "2", "--preset", "fast", "--concurrency", "1,2", "--rate", "40", "--requests", "6"]
    assert main([*args, "--output-tokens", "8", "--out", str(out)]) == 0
    report = json.loads((out / "bench.json").read_text())
    assert [(lv["concurrency"], lv["rate"]) for lv in report["levels"]] == [(1, None), (2, None), (None, 40.0)]
    for lv in report["levels"]:
        assert lv["requests"] == 6 and lv["errors"] == {}
        assert set(lv["per_request"]) == {"ttft_s", "itl_s", "output_tok_s", "e2e_s"}
        assert {"p50", "p90", "p99"} <= set(lv["per_request"]["ttft_s"])
        assert set(lv["per_request"]["itl_s"]) == {"p50", "p99"}
        assert set(lv["per_request"]["output_tok_s"]) == {"p50", "p10"}
        assert set(lv["per_request"]["e2e_s"]) == {"p50", "p99"}
        assert set(lv["aggregate"]) == {"output_tok_s", "requests_s", "concurrency"}
        assert all(v is not None and v > 0 for v in lv["aggregate"].values())
        assert lv["gateway"]["output_tokens"] == lv["tokens"]["output"] == 6 * 8
    assert report["slo"] is not None and report["compare"] is None
    with (out / "bench.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["concurrency"] for r in rows] == ["1", "2", ""]
    printed = capsys.readouterr().out
    assert "your answer (per request)" in printed and "the machine (aggregate)" in printed
    if chart.available():
        assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert "pip install -e '.[bench]'" in printed


def test_without_matplotlib_the_user_is_told_how_to_get_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chart, "available", lambda: False)
    args = ["--simulate", "1", "--preset", "fast", "--concurrency", "1", "--requests", "2", "--output-tokens", "4"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    assert "pip install -e '.[bench]'" in capsys.readouterr().out
    assert not (tmp_path / "bench.png").exists() and (tmp_path / "bench.json").exists()
