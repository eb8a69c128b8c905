"""gateway.policy.kv: KV-cache bytes from published model shapes and hand-written HF config.json fixtures."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from gateway.policy import kv
from gateway.tools import kvcommand
from gateway.tools.hfconfig import load_hf_config

pytestmark = pytest.mark.unit

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs"
K = 1024


def config(name: str) -> dict[str, Any]:
    return load_hf_config(CONFIGS / name / "config.json")


# --- published figures -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("layers", "kv_heads", "head_dim", "expected"),
    [
        (32, 8, 128, 128 * K),  # Llama-3-8B: 128 KiB/token
        (32, 32, 128, 512 * K),  # Llama-2-7B (MHA): 512 KiB/token
        (80, 8, 128, 320 * K),  # Llama-3-70B: 320 KiB/token
    ],
)
def test_published_bytes_per_token(layers: int, kv_heads: int, head_dim: int, expected: int) -> None:
    spec = kv.kv_spec_from_params(layers, kv_heads, head_dim, "fp16")
    assert spec.bytes_per_token == expected
    assert kv.bytes_per_sequence(spec, 1) == expected
    assert kv.bytes_per_sequence(spec, 1000) == 1000 * expected


def test_llama3_8b_exactly_128_kib_per_token() -> None:
    assert kv.kv_spec_from_params(32, 8, 128).bytes_per_token == 131072


def test_seed_style_256k_vs_64k_for_llama3_8b() -> None:
    spec = kv.kv_spec_from_params(32, 8, 128, "fp16")
    assert kv.bytes_per_sequence(spec, kv.parse_cap("256k")) == 32 * 2**30
    assert kv.bytes_per_sequence(spec, kv.parse_cap("64k")) == 8 * 2**30
    assert kv.kv_bytes(spec, 262144, 8) == 256 * 2**30


def test_gqa_vs_mha() -> None:
    mha = kv.kv_spec_from_params(32, 32, 128, attention_heads=32)
    gqa = kv.kv_spec_from_params(32, 8, 128, attention_heads=32)
    mqa = kv.kv_spec_from_params(32, 1, 128, attention_heads=32)
    assert (mha.kind, gqa.kind, mqa.kind) == ("MHA", "GQA", "MQA")
    assert mha.bytes_per_token == 4 * gqa.bytes_per_token == 32 * mqa.bytes_per_token
    assert kv.kv_spec_from_params(32, 8, 128).kind == "MHA/GQA"  # query heads unknown


@pytest.mark.parametrize(
    ("dtype", "ratio"),
    [("fp32", 2.0), ("float16", 1.0), ("bf16", 1.0), ("fp8", 0.5), ("fp8_e5m2", 0.5), ("int8", 0.5)],
)
def test_dtype_scales_bytes(dtype: str, ratio: float) -> None:
    fp16 = kv.kv_spec_from_params(32, 8, 128, "fp16").bytes_per_token
    assert kv.kv_spec_from_params(32, 8, 128, dtype).bytes_per_token == fp16 * ratio


def test_fp8_halves_fp16_from_a_config() -> None:
    cfg = config("Meta-Llama-3-8B")
    fp16 = kv.kv_spec_from_hf_config(cfg, "fp16")
    fp8 = kv.kv_spec_from_hf_config(cfg, "fp8")
    assert fp8.dtype == "fp8_e4m3"
    assert 2 * kv.bytes_per_sequence(fp8, 65536) == kv.bytes_per_sequence(fp16, 65536)


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        ("fp8_e4m3", "fp8_e4m3"),
        ("E4M3", "fp8_e4m3"),
        ("torch.float8_e4m3fn", "fp8_e4m3"),
        ("e5m2", "fp8_e5m2"),
        ("bfloat16", "bf16"),
        ("half", "fp16"),
        ("float", "fp32"),
    ],
)
def test_normalize_dtype(alias: str, canonical: str) -> None:
    assert kv.normalize_dtype(alias) == canonical


@pytest.mark.parametrize("bad", ["int4", "q4_0", "", "fp9"])
def test_unknown_dtype_is_rejected(bad: str) -> None:
    with pytest.raises(ValueError, match="unknown KV dtype"):
        kv.normalize_dtype(bad)


# --- HF config.json fixtures -------------------------------------------------------------------


def test_llama3_8b_config() -> None:
    spec = kv.kv_spec_from_hf_config(config("Meta-Llama-3-8B"))
    assert (spec.num_layers, spec.kv_heads, spec.head_dim, spec.dtype) == (32, 8, 128, "bf16")
    assert spec.kind == "GQA"
    assert spec.bytes_per_token == 131072
    assert spec.sliding_layers == 0
    assert spec.max_context == 8192
    assert spec.name == "LlamaForCausalLM"


def test_mistral_sliding_window_caps_the_sequence_at_the_window() -> None:
    spec = kv.kv_spec_from_hf_config(config("Mistral-7B-v0.1"))
    assert spec.windows == (4096,) * 32
    at_window = 4096 * 131072
    assert kv.bytes_per_sequence(spec, 1000) == 1000 * 131072
    assert kv.bytes_per_sequence(spec, 4096) == at_window
    assert kv.bytes_per_sequence(spec, 32768) == at_window
    assert kv.bytes_per_sequence(spec, 262144) == at_window
    flat = kv.kv_spec_from_hf_config(config("Mistral-7B-v0.1"), sliding_window=False)
    assert kv.bytes_per_sequence(flat, 32768) == 32768 * 131072


def test_deepseek_v3_mla() -> None:
    spec = kv.kv_spec_from_hf_config(config("DeepSeek-V3"))
    assert spec.mla and spec.kind == "MLA"
    assert (spec.num_layers, spec.kv_heads, spec.head_dim, spec.tensors) == (61, 1, 576, 1)
    assert spec.dtype == "bf16"  # torch_dtype, not the fp8 weight quantization
    assert spec.bytes_per_token == 61 * 576 * 2 == 70272
    assert kv.kv_spec_from_hf_config(config("DeepSeek-V3"), "fp8").bytes_per_token == 35136
    assert any("MTP" in n for n in spec.notes)
    # Without MLA the same model would cache K and V for 128 heads: far more.
    naive = kv.kv_spec_from_params(61, 128, 128 + 64, "bf16")
    assert naive.bytes_per_token > 50 * spec.bytes_per_token


def test_gemma2_alternates_local_and_global_layers() -> None:
    spec = kv.kv_spec_from_hf_config(config("gemma-2-9b"))
    assert (spec.num_layers, spec.kv_heads, spec.head_dim) == (42, 8, 256)
    assert spec.windows[:4] == (4096, None, 4096, None)  # layer 0 slides, layer 1 is global
    assert spec.sliding_layers == 21
    per_layer = 2 * 8 * 256 * 2
    assert spec.layer_bytes_per_token == per_layer
    assert kv.bytes_per_sequence(spec, 4096) == 42 * 4096 * per_layer
    assert kv.bytes_per_sequence(spec, 8192) == (21 * 8192 + 21 * 4096) * per_layer
    # float32 checkpoint: "auto" counts what engines serve (16 bits) and says so.
    assert spec.dtype == "bf16"
    assert any("float32" in n for n in spec.notes)
    assert kv.kv_spec_from_hf_config(config("gemma-2-9b"), "fp32").bytes_per_token == 2 * spec.bytes_per_token


def test_qwen25_sliding_window_present_but_disabled() -> None:
    spec = kv.kv_spec_from_hf_config(config("Qwen2.5-7B"))
    assert (spec.num_layers, spec.kv_heads, spec.head_dim) == (28, 4, 128)
    assert spec.sliding_layers == 0
    assert spec.bytes_per_token == 57344
    assert kv.bytes_per_sequence(spec, 131072) == 131072 * 57344


def test_qwen2_with_sliding_on_slides_from_max_window_layers() -> None:
    cfg = {
        **config("Qwen2.5-7B"),
        "use_sliding_window": True,
        "sliding_window": 4096,
        "max_window_layers": 20,
    }
    spec = kv.kv_spec_from_hf_config(cfg)
    assert spec.windows == (None,) * 20 + (4096,) * 8


def test_gemma3_multimodal_uses_text_config_and_pattern_6() -> None:
    spec = kv.kv_spec_from_hf_config(config("gemma-3-27b-it"))
    assert (spec.num_layers, spec.kv_heads, spec.head_dim, spec.dtype) == (62, 16, 128, "bf16")
    full = [i for i, w in enumerate(spec.windows) if w is None]
    assert full == list(range(5, 62, 6))  # every 6th layer is global
    assert set(spec.windows) == {None, 1024}
    per_layer = 2 * 16 * 128 * 2
    assert kv.bytes_per_sequence(spec, 65536) == (10 * 65536 + 52 * 1024) * per_layer


def test_gemma3_text_config_missing_keys_use_transformers_defaults() -> None:
    # gemma-3-4b-it ships a text_config without head counts: transformers' defaults fill them in.
    cfg = {
        "model_type": "gemma3",
        "torch_dtype": "bfloat16",
        "text_config": {
            "model_type": "gemma3_text",
            "hidden_size": 2560,
            "num_hidden_layers": 34,
            "sliding_window": 1024,
        },
    }
    spec = kv.kv_spec_from_hf_config(cfg)
    assert (spec.num_layers, spec.kv_heads, spec.head_dim, spec.attention_heads) == (34, 4, 256, 8)
    assert spec.sliding_layers == 34 - 5


def test_explicit_pattern_and_layer_types() -> None:
    base = {"num_hidden_layers": 8, "num_attention_heads": 8, "hidden_size": 512, "torch_dtype": "float16"}
    pattern = kv.kv_spec_from_hf_config({**base, "sliding_window": 256, "sliding_window_pattern": 4})
    assert pattern.windows == (256, 256, 256, None) * 2
    types = ["full_attention", "sliding_attention"] * 4
    listed = kv.kv_spec_from_hf_config({**base, "sliding_window": 256, "layer_types": types})
    assert listed.windows == (None, 256) * 4
    no_window = kv.kv_spec_from_hf_config({**base, "sliding_window": None, "layer_types": types})
    assert no_window.sliding_layers == 0
    for off in (0, -1, False):
        assert kv.kv_spec_from_hf_config({**base, "sliding_window": off}).sliding_layers == 0
    with pytest.raises(ValueError, match="sliding_window must be a positive integer"):
        kv.kv_spec_from_hf_config({**base, "sliding_window": "4096"})


def test_gpt_oss_layer_types() -> None:
    spec = kv.kv_spec_from_hf_config(config("gpt-oss-20b"))
    assert (spec.num_layers, spec.kv_heads, spec.head_dim) == (24, 8, 64)
    assert spec.windows[:2] == (128, None) and spec.sliding_layers == 12
    assert kv.bytes_per_sequence(spec, 131072) == (12 * 131072 + 12 * 128) * 2048


def test_qwen3_moe_native_256k() -> None:
    spec = kv.kv_spec_from_hf_config(config("Qwen3-30B-A3B-Instruct-2507"))
    assert spec.bytes_per_token == 48 * 4 * 128 * 2 * 2 == 96 * K
    assert spec.max_context == 262144 and spec.sliding_layers == 0


def test_defaults_and_head_dim_from_hidden_size() -> None:
    spec = kv.kv_spec_from_hf_config({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 256})
    assert (spec.kv_heads, spec.head_dim, spec.kind) == (4, 64, "MHA")  # kv heads default to heads
    assert spec.dtype == "bf16" and spec.notes
    mqa = kv.kv_spec_from_hf_config({"n_layer": 2, "n_head": 4, "n_embd": 256, "multi_query": True})
    assert (mqa.kv_heads, mqa.kind) == (1, "MQA")


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        ({"num_attention_heads": 8, "hidden_size": 512}, "missing num_hidden_layers"),
        ({"num_hidden_layers": 2, "hidden_size": 512}, "missing num_attention_heads"),
        ({"num_hidden_layers": 2, "num_attention_heads": 8}, "missing hidden_size"),
        ({"num_hidden_layers": 2, "num_attention_heads": 3, "hidden_size": 512}, "not a multiple"),
        ({"num_hidden_layers": "32", "num_attention_heads": 8, "hidden_size": 512}, "positive integer"),
        ({"num_hidden_layers": True, "num_attention_heads": 8, "hidden_size": 512}, "positive integer"),
        (
            {
                "num_hidden_layers": 2,
                "num_attention_heads": 8,
                "hidden_size": 512,
                "sliding_window": 4,
                "layer_types": ["sliding_attention"],
            },
            "layer_types has 1 entries for 2 layers",
        ),
        (
            {"num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 512, "torch_dtype": "int4"},
            "torch_dtype 'int4' is not a KV dtype",
        ),
        ({"num_hidden_layers": 2, "num_attention_heads": 8, "kv_lora_rank": 512}, "missing qk_rope_head_dim"),
    ],
)
def test_bad_configs_name_the_problem(cfg: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        kv.kv_spec_from_hf_config(cfg)


def test_load_hf_config(tmp_path: Path) -> None:
    assert load_hf_config(CONFIGS / "Meta-Llama-3-8B")["num_hidden_layers"] == 32  # a model directory
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_hf_config(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        load_hf_config(tmp_path / "list.json")
    with pytest.raises(OSError):
        load_hf_config(tmp_path / "missing.json")


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.iterdir() if p.is_dir()))
def test_every_fixture_parses_and_tabulates(name: str) -> None:
    spec = kv.kv_spec_from_hf_config(config(name))
    assert spec.bytes_per_token > 0
    assert kv.bytes_per_sequence(spec, 65536) <= kv.bytes_per_sequence(spec, 262144)
    assert "256k" in kv.format_table(spec, [262144, 65536], [1, 8])


# --- spec, sizing and helpers ------------------------------------------------------------------


def test_kvspec_is_frozen_and_validated() -> None:
    spec = kv.kv_spec_from_params(2, 2, 64)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.kv_heads = 4  # type: ignore[misc]
    with pytest.raises(ValueError):
        kv.KVSpec(kv_heads=0, head_dim=64, windows=(None,))
    with pytest.raises(ValueError):
        kv.KVSpec(kv_heads=1, head_dim=64, windows=())
    with pytest.raises(ValueError):
        kv.KVSpec(kv_heads=1, head_dim=64, windows=(0,))
    with pytest.raises(ValueError, match="canonical"):
        kv.KVSpec(kv_heads=1, head_dim=64, windows=(None,), dtype="float16")
    with pytest.raises(ValueError):
        kv.kv_spec_from_params(0, 8, 128)


def test_kv_bytes_and_max_concurrency() -> None:
    spec = kv.kv_spec_from_params(32, 8, 128)
    per_seq = kv.bytes_per_sequence(spec, 65536)
    assert kv.kv_bytes(spec, 65536, 32) == 32 * per_seq
    assert kv.kv_bytes(spec, 65536, 0) == 0
    assert kv.bytes_per_sequence(spec, 0) == 0
    assert kv.max_concurrency(spec, 65536, 80 * kv.GB) == 9  # 8.59 GB each
    assert kv.max_concurrency(spec, 262144, 80 * kv.GB) == 2
    assert kv.max_concurrency(spec, 65536, per_seq) == 1
    assert kv.max_concurrency(spec, 65536, per_seq - 1) == 0
    assert kv.max_concurrency(spec, 65536, -5) == 0
    with pytest.raises(ValueError):
        kv.max_concurrency(spec, 0, kv.GB)
    with pytest.raises(ValueError):
        kv.kv_bytes(spec, 10, -1)
    with pytest.raises(ValueError):
        kv.bytes_per_sequence(spec, -1)


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("256k", 262144),
        ("64K", 65536),
        (" 131072 ", 131072),
        ("1m", 1048576),
        ("1.5k", 1536),
        ("128_000", 128000),
    ],
)
def test_parse_cap(text: str, tokens: int) -> None:
    assert kv.parse_cap(text) == tokens


@pytest.mark.parametrize("bad", ["", "k", "0", "-1k", "1.0001k", "64kb", "2g", "abc", "6 4k"])
def test_parse_cap_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="bad token count"):
        kv.parse_cap(bad)


def test_parse_caps_and_format_cap() -> None:
    assert kv.parse_caps("256k,64k,131072") == [262144, 65536, 131072]
    assert [kv.format_cap(n) for n in (262144, 65536, 1000)] == ["256k", "64k", "1000"]


def test_format_table_contents() -> None:
    spec = kv.kv_spec_from_params(32, 8, 128, "fp16", attention_heads=32, name="llama3-8b")
    table = kv.format_table(spec, [262144, 65536], [1, 8, 32], budget_bytes=80 * kv.GB)
    assert "llama3-8b: GQA, 32 layers x 8 KV heads x head_dim 128" in table
    assert "131,072 bytes (128.00 KiB)" in table
    assert "GB = 10^9 bytes, GiB = 2^30 bytes" in table
    rows = {line.split()[0]: line for line in table.splitlines() if line[:1].isdigit() and "instead" not in line}
    assert "34.36 GB (32.00 GiB)" in rows["256k"] and "1,099.51 GB (1,024.00 GiB)" in rows["256k"]
    assert "8.59 GB (8.00 GiB)" in rows["64k"] and rows["64k"].split()[-1] == "9"
    assert "fit in 80 GB" in table
    assert "64k instead of 256k: 25.77 GB less KV per sequence (-75%)" in table
    with pytest.raises(ValueError):
        kv.format_table(spec, [], [1])


def test_format_table_flags_caps_beyond_the_model_and_sliding() -> None:
    spec = kv.kv_spec_from_hf_config(config("Mistral-7B-v0.1"))
    table = kv.format_table(spec, [262144, 4096], [1])
    assert "256k*" in table and "max_position_embeddings (32,768)" in table
    assert "all 32 layers hold at most 4,096 tokens" in table
    assert "4k instead of 256k: the same KV per sequence" in table
    gemma = kv.format_table(kv.kv_spec_from_hf_config(config("gemma-2-9b")), [8192], [1])
    assert "21 of 42 layers hold at most 4,096 tokens" in gemma and "note: auto:" in gemma
    mla = kv.format_table(kv.kv_spec_from_hf_config(config("DeepSeek-V3")), [65536], [1])
    assert "MLA, 61 layers x latent 576" in mla


# --- the `gateway kv` subcommand ---------------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gateway kv")
    kvcommand.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_run_with_a_config(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(CONFIGS / "Meta-Llama-3-8B" / "config.json")
    assert kvcommand.run(parse(path, "--caps", "256k,64k", "--concurrency", "1,8", "--budget-gb", "80")) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.startswith("Meta-Llama-3-8B: GQA")
    assert "256k" in out and "64k" in out and "fit in 80 GB" in out and "34.36 GB" in out


def test_run_with_a_model_directory_and_kv_dtype(capsys: pytest.CaptureFixture[str]) -> None:
    assert kvcommand.run(parse(str(CONFIGS / "DeepSeek-V3"), "--kv-dtype", "fp8")) == 0
    out = capsys.readouterr().out
    assert out.startswith("DeepSeek-V3: MLA") and "fp8_e4m3" in out and "35,136 bytes" in out


def test_run_no_sliding_window(capsys: pytest.CaptureFixture[str]) -> None:
    assert kvcommand.run(parse(str(CONFIGS / "Mistral-7B-v0.1"), "--caps", "32k", "--no-sliding-window")) == 0
    out = capsys.readouterr().out
    assert "4.29 GB" in out  # 32768 x 128 KiB, not capped at the window
    assert "note: sliding-window layers counted at full context" in out and "up to" not in out


def test_run_with_params(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ("--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--dtype", "fp16", "--heads", "32")
    assert kvcommand.run(parse(*argv)) == 0
    out = capsys.readouterr().out
    assert "GQA" in out and "131,072 bytes" in out and "fp16" in out
    assert kvcommand.run(parse("--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--window", "4096")) == 0
    assert "all 32 layers hold at most 4,096 tokens" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ((), "give a config.json path, or all of"),
        (("--layers", "32", "--kv-heads", "8"), "give a config.json path, or all of"),
        (("x.json", "--layers", "32"), "not both"),
        (("--layers", "0", "--kv-heads", "8", "--head-dim", "128"), "--layers must be >= 1"),
        (("/nonexistent/config.json",), "No such file"),
        (("CFG", "--caps", "lots"), "bad token count 'lots'"),
        (("CFG", "--caps", ""), "bad token count"),
        (("CFG", "--concurrency", "1,x"), "bad --concurrency"),
        (("CFG", "--concurrency", "0"), "bad --concurrency"),
        (("CFG", "--kv-dtype", "int4"), "unknown KV dtype 'int4'"),
        (("CFG", "--budget-gb", "0"), "--budget-gb must be a positive"),
        (("CFG", "--budget-gb", "nan"), "--budget-gb must be a positive"),
        (("CFG", "--budget-gb", "inf"), "--budget-gb must be a positive"),
        (("BAD",), "not valid JSON"),
    ],
)
def test_run_errors_exit_2_with_one_clear_line(
    argv: tuple[str, ...], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"num_hidden_layers": 2})[:-1])
    good = str(CONFIGS / "Qwen2.5-7B" / "config.json")
    args = [good if a == "CFG" else str(bad) if a == "BAD" else a for a in argv]
    assert kvcommand.run(parse(*args)) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("gateway kv: error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_argparse_rejects_non_integers(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse("--layers", "x")
    assert exc.value.code == 2
    assert "invalid int value: 'x'" in capsys.readouterr().err


def test_docs_tables_are_real_output(capsys: pytest.CaptureFixture[str]) -> None:
    """Every ``$ gateway kv ...`` block in docs/caps.md is what the code prints today."""
    root = Path(__file__).resolve().parents[2]
    doc = (root / "docs" / "caps.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```\n\$ gateway kv (.*?)\n(.*?)\n```", doc, flags=re.S)
    assert len(blocks) >= 2
    for argv, shown in blocks:
        args = [str(root / a) if a.startswith("tests/") else a for a in argv.split()]
        assert kvcommand.run(parse(*args)) == 0
        assert capsys.readouterr().out.rstrip("\n") == shown, argv
