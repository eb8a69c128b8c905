"""The CLI's offline subcommands: check, plan, explain."""

from __future__ import annotations

import json
from collections.abc import Coroutine
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from gateway.cli import main
from gateway.config_loader import load_config
from tests.unit.model_files import write_model

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_check_ok_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(ROOT / "gateway.yaml")]) == 0
    assert "OK (3 pools, 3 backends, 1 route)" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools: {p: {engine: nope, backends: []}}\nroutes: [{model: m, pools: [q]}]\n")
    assert main(["check", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "pools.p.engine" in err and "pools.p.backends" in err


def test_check_reads_a_pools_tokenizer_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pool = (
        "pools:\n  p:\n    engine: vllm\n    balancer: kv_events\n    tokenizer: {dir}\n"
        "    backends: [{{url: 'http://127.0.0.1:9', kv_events: {{endpoint: 'tcp://127.0.0.1:9'}}}}]\n"
        "routes: [{{model: m, pools: [p]}}]\n"
    )
    cfg = tmp_path / "g.yaml"
    cfg.write_text(pool.format(dir=tmp_path / "missing"))
    assert main(["check", str(cfg)]) == 1
    assert "invalid config" in (err := capsys.readouterr().err) and "tokenizer.json" in err, err
    cfg.write_text(pool.format(dir=write_model(tmp_path)))
    assert main(["check", str(cfg)]) == 0, capsys.readouterr().err
    cfg.write_text(pool.format(dir=tmp_path).replace("kv_events\n", "least_load\n", 1))
    assert main(["check", str(cfg)]) == 1
    assert "kv_events balancer only" in capsys.readouterr().err


def test_sim_listens_where_the_shipped_config_looks_for_its_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """`gateway sim --flavour X` then `gateway serve` works unchanged: each flavour's default port is
    the one the shipped gateway.yaml's pool of that engine points at."""
    import gateway.cli

    config = load_config(ROOT / "gateway.yaml")
    shipped = {pool.engine: urlsplit(pool.backends[0].url).port for pool in config.pools.values()}
    ports: list[int] = []

    def not_serving(main: Coroutine[Any, Any, None], port: int) -> int:
        main.close()  # the simulator's coroutine, never started
        ports.append(port)
        return 0

    monkeypatch.setattr(gateway.cli, "_serving", not_serving)
    for flavour in ("vllm", "sglang", "llamacpp"):
        assert main(["sim", "--flavour", flavour]) == 0
        assert ports.pop() == shipped[flavour]
    assert main(["sim", "--flavour", "llamacpp", "--port", "9000"]) == 0
    assert ports.pop() == 9000


def test_plan_pushes_the_cap_into_each_engine(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = ROOT / "tests/fixtures/hf_configs/Meta-Llama-3-8B/config.json"
    assert (
        main(
            ["plan", "--offline", "--config", str(ROOT / "gateway.yaml"), "--model-config", str(cfg), "--parallel", "4"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "--max-model-len 65536" in out  # vLLM
    assert "--context-length 65536" in out  # SGLang
    assert "-c 262144 --parallel 4" in out  # llama.cpp splits -c across its slots
    # Llama-3-8B: 128 KiB per token -> 65536 tokens = 8.59 GB per sequence, 34.36 GB for 4.
    assert "8.59 GB per sequence" in out and "34.36 GB for 4" in out
    # ...and its window is 8192 (max_position_embeddings): each of the three backends is warned.
    warning = "# WARNING: the cap (65,536 tokens) is over the model's context window (8,192"
    assert out.count(warning) == 3
    assert "vllm serve '<MODEL_PATH>' --host 127.0.0.1 --port 8000" in out  # loopback URL, loopback bind


def test_plan_within_the_window_does_not_warn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = ROOT / "tests/fixtures/hf_configs/Qwen2.5-7B/config.json"  # window 131072 > the cap of 65536
    assert json.loads(cfg.read_text())["max_position_embeddings"] > 65536
    assert main(["plan", "--offline", "--model-config", str(cfg)]) == 0
    assert "WARNING" not in capsys.readouterr().out


def test_plan_for_compose_names_the_model_and_binds_all_interfaces(capsys: pytest.CaptureFixture[str]) -> None:
    """Not `vllm serve tiny --host vllm` (the served name as the model path, a DNS name
    as the bind address) but a model-path placeholder, the served name, and 0.0.0.0."""
    assert main(["plan", "--offline", "--config", str(ROOT / "deploy/compose/gateway.yaml")]) == 0
    out = capsys.readouterr().out
    assert "vllm serve '<MODEL_PATH>' --served-model-name tiny --host 0.0.0.0 --port 8000 --max-model-len" in out
    assert "--model-path '<MODEL_PATH>' --served-model-name tiny --host 0.0.0.0 --port 30000" in out
    assert "llama-server -m '<MODEL_PATH>' --alias tiny --host 0.0.0.0 --port 8080" in out
    assert "--host vllm" not in out and "serve tiny" not in out


def test_explain_shows_the_decision(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = tmp_path / "b.json"
    body.write_text(json.dumps({"model": "x", "messages": [{"role": "user", "content": "hi"}]}))
    for platform, pool in (("nvidia_gpu", "vllm"), ("mac", "llamacpp"), ("no_nvidia_gpu", "llamacpp")):
        assert main(["explain", str(body), "--config", str(ROOT / "gateway.yaml"), "--platform", platform]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["decision"]["pool"] == pool
        assert out["backends_in_order"] == [f"{pool}-0"]


def test_check_reports_each_mistake_once_with_suggestions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Three mistakes are three lines (no phantom `routes: Tuple should have at
    least 1 item`), each with a "did you mean"."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "pools:\n  vllm:\n    engine: vlm\n    backends: [{url: 'http://127.0.0.1:8000'}]\n"
        "routes:\n  - model: '*'\n    pools: [vllm]\n    caps: {max_context_token: 4096, on_exceed: rejct}\n"
    )
    assert main(["check", str(bad)]) == 1
    problems = capsys.readouterr().err.splitlines()[1:]
    assert problems == [
        "  pools.vllm.engine: Input should be 'vllm', 'sglang', 'llamacpp', 'trtllm', 'lmdeploy', 'nim', 'ollama',"
        " 'openai' or 'sim'; did you mean 'vllm'?",
        "  routes.0.caps.on_exceed: Input should be 'reject' or 'truncate_oldest'; did you mean 'reject'?",
        "  routes.0.caps.max_context_token: unknown key 'max_context_token'; did you mean 'max_context_tokens'?",
    ]


def test_check_a_misspelt_required_key_is_one_mistake(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools: {a: {engine: vllm, backend: []}}\nservr: {}\nroutes: [{model: m, pools: [a]}]\n")
    assert main(["check", str(bad)]) == 1
    assert capsys.readouterr().err.splitlines()[1:] == [
        "  pools.a.backend: unknown key 'backend'; did you mean 'backends'?",
        "  servr: unknown key 'servr'; did you mean 'server'?",
    ]


def test_check_names_the_file_and_line_of_a_yaml_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools:\n  a: b\n    c: d\n")
    assert main(["check", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}, line 3, column 6: invalid YAML: mapping values are not allowed here" in err
    assert "<unicode string>" not in err


def test_explain_a_messages_body_fingerprints_its_system_prompt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The shared-prefix detector sees Anthropic Messages' system + messages (as the chat they translate to)."""
    system = "You are a coding agent with a long shared system prompt. " * 40
    blocks = []
    for body in (
        {"model": "x", "max_tokens": 8, "system": system, "messages": [{"role": "user", "content": "hi"}]},
        {"model": "x", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
    ):
        path = tmp_path / "m.json"
        path.write_text(json.dumps(body))
        assert main(["explain", str(path), "--config", str(ROOT / "gateway.yaml"), "--kind", "messages"]) == 0
        blocks.append(json.loads(capsys.readouterr().out)["fingerprint_blocks"])
    assert blocks[0] > blocks[1]
