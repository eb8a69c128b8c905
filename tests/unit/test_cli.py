"""The CLI's offline subcommands: check, plan, explain."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.cli import main

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_check_ok_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(ROOT / "gateway.yaml")]) == 0
    assert "OK (3 pools, 3 backends, 1 routes)" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools: {p: {engine: nope, backends: []}}\nroutes: [{model: m, pools: [q]}]\n")
    assert main(["check", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "pools.p.engine" in err and "pools.p.backends" in err


def test_plan_pushes_the_cap_into_each_engine(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = ROOT / "tests/fixtures/hf_configs/Meta-Llama-3-8B/config.json"
    assert main(["plan", "--config", str(ROOT / "gateway.yaml"), "--model-config", str(cfg), "--parallel", "4"]) == 0
    out = capsys.readouterr().out
    assert "--max-model-len 65536" in out  # vLLM
    assert "--context-length 65536" in out  # SGLang
    assert "-c 262144 --parallel 4" in out  # llama.cpp splits -c across its slots
    # Llama-3-8B: 128 KiB per token -> 65536 tokens = 8.59 GB per sequence, 34.36 GB for 4.
    assert "8.59 GB per sequence" in out and "34.36 GB for 4" in out


def test_explain_shows_the_decision(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = tmp_path / "b.json"
    body.write_text(json.dumps({"model": "x", "messages": [{"role": "user", "content": "hi"}]}))
    for platform, pool in (("nvidia_gpu", "vllm"), ("mac", "llamacpp"), ("no_nvidia_gpu", "llamacpp")):
        assert main(["explain", str(body), "--config", str(ROOT / "gateway.yaml"), "--platform", platform]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["decision"]["pool"] == pool
        assert out["backends_in_order"] == [f"{pool}-0"]
