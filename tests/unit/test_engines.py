"""Engine adapters: metrics per engine and version, error shapes, token counting, launch commands."""

from __future__ import annotations

import ast
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest

from engines.adapters import ADAPTERS, KINDS, adapter_for
from engines.base import LaunchSpec, NormalisedError, TokenizeCall
from engines.promtext import Series, read_samples

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ENGINE_FIXTURES = FIXTURES / "engines"
ENGINES_DIR = Path(__file__).resolve().parents[2] / "engines"
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"}]


def metrics(name: str) -> str:
    return (ENGINE_FIXTURES / f"{name}.metrics.txt").read_text()


# ---------------------------------------------------------------- the Prometheus text reader

READER_TEXT = """\
# HELP a A gauge.
# TYPE a gauge
a 1.5
a{x="1"} 2
a{x="with } brace",y="and \\"quotes\\" and spaces"} 3 1700000000000
a\t4
a_total 100
b{x="1"} NaN
b{x="2"} 5
c{le="+Inf"} +Inf
d 1e+03\r
e{x="1"}
f not-a-number
not_wanted 7
# EOF
"""


def test_reader_sums_label_sets_and_skips_noise() -> None:
    got = read_samples(READER_TEXT, {"a", "b", "c", "d", "e", "f"})
    assert got["a"] == Series(1.5 + 2 + 3 + 4, 4)  # a_total is another name
    assert got["b"] == Series(5.0, 1)  # NaN skipped
    assert got["c"].total == float("inf")
    assert got["d"] == Series(1000.0, 1)
    assert "e" not in got and "f" not in got and "not_wanted" not in got


def test_reader_on_empty_and_garbage_text() -> None:
    assert read_samples("", {"a"}) == {}
    assert read_samples("<html>502</html>\n{\n}\n", {"a"}) == {}


def test_reader_is_cheap_on_a_large_scrape() -> None:
    lines = [f'vllm:x_bucket{{engine="0",le="{i}",model_name="m"}} {i}.0' for i in range(20_000)]
    text = "\n".join([*lines, 'vllm:num_requests_running{engine="0",model_name="m"} 3.0'])
    start = time.perf_counter()
    load = adapter_for("vllm").parse_load(text, now=1.0)
    assert load.running == 3.0
    assert time.perf_counter() - start < 1.0  # about 10 ms in practice; the bound only catches blowups


# ---------------------------------------------------------------- metrics -> EngineLoad

LLAMACPP_BUSY_HIT = 97 / (97 + 259)  # cached / (cached + evaluated): prompt_tokens_total excludes cached
LOAD_CASES = [
    # kind, fixture, running, waiting, kv_usage, prefix_hit_rate
    ("vllm", "vllm_v1", 2, 3, 0.4375, 0.75),
    ("vllm", "vllm_v1_dp2", 3, 4, 0.375, 0.5),  # counts summed, KV usage averaged over engines
    ("vllm", "vllm_v1_old_gpu_names", 7, 1, 0.8125, 0.25),
    ("vllm", "vllm_v0", 1, 0, 0.0234375, 0.625),
    ("sglang", "sglang_colon", 5, 2, 0.61, 0.3),  # counters: (1000 + 200) / 4000
    ("sglang", "sglang_underscore", 1, 0, 0.05, 0.42),  # gauge fallback
    ("llamacpp", "llamacpp_busy", 4, 3, None, LLAMACPP_BUSY_HIT),
    ("llamacpp", "llamacpp_idle", 0, 0, None, None),  # no prompt yet: no rate
    ("trtllm", "trtllm", 3, 1, 0.5, 0.75),  # reused / (reused + missed) blocks
    ("lmdeploy", "lmdeploy", 2, 5, 0.9, 0.095),
    ("nim", "nim_v1", 4, 0, 0.33, None),
    ("nim", "vllm_v1", 2, 3, 0.4375, 0.75),  # NIM 2.x passes vLLM's names through
    ("sim", "vllm_v1", 2, 3, 0.4375, 0.75),
    ("sim", "sglang_colon", 5, 2, 0.61, 0.3),
    ("sim", "sglang_underscore", 1, 0, 0.05, 0.42),
    ("sim", "llamacpp_busy", 4, 3, None, LLAMACPP_BUSY_HIT),
    ("ollama", "vllm_v1", None, None, None, None),  # no Prometheus metrics at all
    ("openai", "vllm_v1", None, None, None, None),
    ("vllm", "sglang_colon", None, None, None, None),  # another engine's names mean nothing
]


@pytest.mark.parametrize(("kind", "fixture", "running", "waiting", "kv", "hit"), LOAD_CASES)
def test_parse_load(
    kind: str, fixture: str, running: float | None, waiting: float | None, kv: float | None, hit: float | None
) -> None:
    load = adapter_for(kind).parse_load(metrics(fixture), now=123.5)
    assert load.running == running
    assert load.waiting == waiting
    assert load.kv_usage == (None if kv is None else pytest.approx(kv))
    assert load.prefix_hit_rate == (None if hit is None else pytest.approx(hit))
    assert load.scraped_at == 123.5


@pytest.mark.parametrize(
    ("text", "kv", "hit"),
    [
        ('vllm:kv_cache_usage_perc{engine="0"} 1.7', 1.0, None),  # clamped to 0..1
        ("vllm:gpu_prefix_cache_hit_rate -1.0", None, None),  # V0's "prefix caching off"
        ("vllm:kv_cache_usage_perc NaN\nvllm:gpu_cache_usage_perc 0.5", 0.5, None),  # NaN = absent
        ("vllm:prefix_cache_hits_total 5\nvllm:prefix_cache_queries_total 0\n"
         "vllm:gpu_prefix_cache_hit_rate 0.2", None, 0.2),  # no queries yet: fall back to the gauge
    ],
)  # fmt: skip
def test_parse_load_edges(text: str, kv: float | None, hit: float | None) -> None:
    load = adapter_for("vllm").parse_load(text, now=0.0)
    assert load.kv_usage == kv
    assert load.prefix_hit_rate == hit


@pytest.mark.parametrize("kind", KINDS)
def test_parse_load_never_raises_on_garbage(kind: str) -> None:
    for text in ("", "<html><body>502</body></html>", "{{{{", "\x00\xff" * 100, "vllm:num_requests_running"):
        load = adapter_for(kind).parse_load(text, now=1.0)
        assert load.running is None and load.kv_usage is None


# Recorded from real servers by tests/engines/record_fixtures.py, when someone has run it.
@pytest.mark.parametrize(("kind", "kv_expected"), [("llamacpp", False), ("vllm", True)])
def test_parse_load_of_recorded_metrics(kind: str, kv_expected: bool) -> None:
    path = FIXTURES / kind / "metrics.txt"
    if not path.exists():
        pytest.skip(f"no recorded {path.relative_to(FIXTURES)} yet")
    load = adapter_for(kind).parse_load(path.read_text(), now=1.0)
    assert load.running is not None and load.waiting is not None
    assert (load.kv_usage is not None) == kv_expected
    if load.prefix_hit_rate is not None:
        assert 0.0 <= load.prefix_hit_rate <= 1.0


# ---------------------------------------------------------------- errors

ERROR_CASES: list[dict[str, Any]] = json.loads((ENGINE_FIXTURES / "errors.json").read_text())["cases"]


def assert_well_formed(err: NormalisedError) -> None:
    assert isinstance(err.message, str) and err.message
    assert err.code is None or isinstance(err.code, str)
    assert err.param is None or isinstance(err.param, str)
    assert "://" not in err.message
    assert len(err.message) <= 1100
    body = err.body()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    json.dumps(body)


@pytest.mark.parametrize("case", ERROR_CASES, ids=[c["name"] for c in ERROR_CASES])
def test_normalise_error(case: dict[str, Any]) -> None:
    err = adapter_for(case["engine"]).normalise_error(case["status"], case["body"].encode())
    expect = case["expect"]
    assert (err.status, err.type, err.code) == (expect["status"], expect["type"], expect["code"])
    if "param" in expect:
        assert err.param == expect["param"]
    assert expect["message_contains"] in err.message
    if "message_excludes" in expect:
        assert expect["message_excludes"] not in err.message
    assert_well_formed(err)


CONTEXT_BODY = ERROR_CASES[0]["body"].encode()


@pytest.mark.parametrize("kind", KINDS)
def test_every_adapter_recognises_context_errors(kind: str) -> None:
    err = adapter_for(kind).normalise_error(400, CONTEXT_BODY)
    assert (err.status, err.code) == (400, "context_length_exceeded")


GARBAGE_BODIES = [
    b"",
    b"   \n",
    b"\xff\xfe\x00garbage",
    b"null",
    b"42",
    b'"just a string"',
    b'{"error": 5}',
    b'{"error": null, "message": null}',
    b'{"error": {"message": ["a", {"msg": "b"}], "code": {"x": 1}, "param": 3, "type": []}}',
    b'{"message": {"nested": true}}',
    b"[" * 100_000,
    b'{"error": {"message": "' + b"x" * 2_000_000 + b'"}}',
    b"<html>" + b"<div>" * 10_000,
]


@pytest.mark.parametrize("status", [400, 404, 413, 429, 500, 502, 503, 200])
@pytest.mark.parametrize("body", GARBAGE_BODIES, ids=range(len(GARBAGE_BODIES)))
def test_normalise_error_never_raises(status: int, body: bytes) -> None:
    err = adapter_for("vllm").normalise_error(status, body)
    assert_well_formed(err)
    if status >= 500 or status < 400:
        assert (err.status, err.type) == (502, "upstream_error")


def test_non_json_snippet_is_short() -> None:
    err = adapter_for("openai").normalise_error(500, b"Internal Server Error\n" + b"Traceback line\n" * 500)
    assert err.status == 502 and len(err.message) < 220
    assert err.message.startswith("upstream error (HTTP 500): Internal Server Error")


# Recorded from real servers, when present: every error the engines sent must normalise cleanly,
# and "too long" must be a context_length_exceeded whatever status the engine used.
def recorded_errors() -> list[tuple[str, Path]]:
    return [(kind, p) for kind in ("llamacpp", "vllm") for p in sorted((FIXTURES / kind).glob("error_*.json"))]


NONE_RECORDED = pytest.param("", Path(), marks=pytest.mark.skip(reason="no recorded errors yet"))


@pytest.mark.parametrize(("kind", "path"), recorded_errors() or [NONE_RECORDED])
def test_normalise_recorded_errors(kind: str, path: Path) -> None:
    rec = json.loads(path.read_text())
    if rec.get("status", 200) < 400:
        pytest.skip("the engine accepted this one")
    if "body" in rec:
        body = (rec["body"] if isinstance(rec["body"], str) else json.dumps(rec["body"])).encode()
    else:  # a stream's raw bytes live beside it
        body = (path.parent / rec["body_file"]).read_bytes()
    err = adapter_for(kind).normalise_error(rec["status"], body)
    assert_well_formed(err)
    if path.name.startswith("error_too_long"):
        assert (err.status, err.code) == (400, "context_length_exceeded")
    if path.name == "error_unknown_model.json":
        assert err.code == "model_not_found"
    if path.name == "error_malformed_json.json":  # 500 from some llama.cpp builds, 400 from others
        assert (err.status, err.type) == (400, "invalid_request_error")


# ---------------------------------------------------------------- token counting


def run_tokenize(kind: str, messages: Any, prompt: str | None, answers: list[Any]) -> tuple[list[Any], int | None]:
    """Drive the caller's loop with canned answers; returns the calls made and the count."""
    adapter = adapter_for(kind)
    made: list[TokenizeCall] = list(adapter.tokenize_calls("m", messages, prompt))
    replies = [answers[i] for i in range(len(made))]
    while (call := adapter.next_tokenize_call(replies)) is not None:
        made.append(call)
        replies.append(answers[len(replies)])
    return [(c.path, dict(c.json)) for c in made], adapter.count_tokens(replies)


VLLM_CHAT = ("/tokenize", {"model": "m", "messages": MESSAGES, "add_generation_prompt": True})
TOKENIZE_CASES = [
    # kind, messages, prompt, canned answers, expected calls, expected count
    ("vllm", MESSAGES, None, [{"count": 17, "max_model_len": 1024, "tokens": list(range(17))}],
     [VLLM_CHAT], 17),
    ("vllm", None, "hello", [{"count": 2, "tokens": [1, 2]}],
     [("/tokenize", {"model": "m", "prompt": "hello"})], 2),
    ("vllm", MESSAGES, None, [{"error": {"message": "no"}}], [VLLM_CHAT], None),
    ("vllm", None, None, [], [], None),
    ("nim", MESSAGES, None, [{"count": 9}], [VLLM_CHAT], 9),
    (
        "llamacpp", MESSAGES, None,
        [{"prompt": "<|im_start|>system\nYou are terse.<|im_end|>\n"}, {"tokens": [5, 6, 7]}],
        [("/apply-template", {"messages": MESSAGES}),
         ("/tokenize", {"content": "<|im_start|>system\nYou are terse.<|im_end|>\n", "add_special": True})],
        3,
    ),
    ("llamacpp", None, "hello", [{"tokens": [1, 2, 3, 4]}],
     [("/tokenize", {"content": "hello", "add_special": True})], 4),
    ("llamacpp", MESSAGES, None, [{"error": {"code": 404, "message": "File Not Found"}}],
     [("/apply-template", {"messages": MESSAGES})], None),  # an old build without /apply-template
    ("sglang", None, "hello", [{"tokens": [1, 2], "count": 2, "max_model_len": 1024}],
     [("/tokenize", {"model": "m", "prompt": "hello"})], 2),
    ("sglang", MESSAGES, None, [{"tokens": [1], "count": 17, "max_model_len": 4096}],
     [VLLM_CHAT], 17),  # SGLang 0.5's /tokenize renders the chat template, as vLLM's does
    ("lmdeploy", None, "hello", [{"input_ids": [1, 2, 3], "length": 3}],
     [("/v1/encode", {"input": "hello", "do_preprocess": False, "add_bos": True})], 3),
    ("lmdeploy", MESSAGES, None, [], [], None),
    ("trtllm", MESSAGES, None, [], [], None),
    ("ollama", None, "hello", [], [], None),
    ("openai", MESSAGES, None, [], [], None),
    ("sim", MESSAGES, None, [], [], None),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "messages", "prompt", "answers", "calls", "count"), TOKENIZE_CASES)
def test_tokenize(kind: str, messages: Any, prompt: Any, answers: list[Any], calls: list[Any], count: Any) -> None:
    assert run_tokenize(kind, messages, prompt, answers) == (calls, count)


@pytest.mark.parametrize("answer", [None, [], "x", {"count": True}, {"count": -1}, {"tokens": "abc"}, {"count": "7"}])
def test_count_tokens_rejects_odd_answers(answer: Any) -> None:
    for kind in ("vllm", "sglang", "llamacpp", "lmdeploy"):
        assert adapter_for(kind).count_tokens([answer]) is None
    assert adapter_for("vllm").count_tokens([]) is None


# The recorded requests (real servers) are exactly what the adapters send, and their answers count.
@pytest.mark.parametrize(
    ("kind", "name"),
    [("vllm", "tokenize_messages"), ("vllm", "tokenize_prompt"), ("llamacpp", "apply_template")],
)
def test_tokenize_against_recorded(kind: str, name: str) -> None:
    path = FIXTURES / kind / f"{name}.json"
    if not path.exists():
        pytest.skip(f"no recorded {path.relative_to(FIXTURES)} yet")
    rec = json.loads(path.read_text())
    sent = rec["request"]["body"]
    calls = adapter_for(kind).tokenize_calls(sent.get("model", "m"), sent.get("messages"), sent.get("prompt"))
    assert dict(calls[0].json) == sent and calls[0].path == rec["request"]["path"]
    if kind == "vllm":
        assert adapter_for(kind).count_tokens([rec["body"]]) == rec["body"]["count"]
    else:
        follow = adapter_for(kind).next_tokenize_call([rec["body"]])
        assert follow is not None and follow.json["content"] == rec["body"]["prompt"]


# ---------------------------------------------------------------- launch commands

SPEC = LaunchSpec(model="M", host="0.0.0.0", port=8001, max_context_tokens=4096, parallel=4)
LAUNCH_CASES = [
    ("vllm", SPEC,
     ["vllm", "serve", "M", "--host", "0.0.0.0", "--port", "8001", "--max-model-len", "4096",
      "--max-num-seqs", "4", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]),
    ("sglang", SPEC,
     ["python", "-m", "sglang.launch_server", "--model-path", "M", "--host", "0.0.0.0", "--port", "8001",
      "--context-length", "4096", "--enable-metrics", "--tool-call-parser", "qwen25"]),
    # llama.cpp splits -c across the slots: 4 slots x 4096 tokens each
    ("llamacpp", SPEC,
     ["llama-server", "-m", "M", "--host", "0.0.0.0", "--port", "8001", "-c", "16384", "--parallel", "4",
      "--metrics"]),
    ("llamacpp", dataclasses.replace(SPEC, parallel=1),
     ["llama-server", "-m", "M", "--host", "0.0.0.0", "--port", "8001", "-c", "4096", "--parallel", "1",
      "--metrics"]),
    ("trtllm", SPEC,
     ["trtllm-serve", "M", "--host", "0.0.0.0", "--port", "8001", "--max_seq_len", "4096",
      "--max_batch_size", "4"]),
    ("lmdeploy", SPEC,
     ["lmdeploy", "serve", "api_server", "M", "--server-name", "0.0.0.0", "--server-port", "8001",
      "--session-len", "4096", "--max-batch-size", "4"]),
    ("nim", dataclasses.replace(SPEC, extra={"image": "nvcr.io/nim/meta/llama-3.1-8b-instruct:latest"}),
     ["docker", "run", "--rm", "--gpus", "all", "-e", "NGC_API_KEY", "-e", "NIM_MAX_MODEL_LEN=4096",
      "-p", "0.0.0.0:8001:8000", "nvcr.io/nim/meta/llama-3.1-8b-instruct:latest"]),
    ("ollama", SPEC,
     ["env", "OLLAMA_HOST=0.0.0.0:8001", "OLLAMA_CONTEXT_LENGTH=4096", "OLLAMA_NUM_PARALLEL=4",
      "ollama", "serve"]),
    ("openai", SPEC, []),
    ("sim", SPEC, []),
    # the backend's `model:` as the served name
    ("vllm", dataclasses.replace(SPEC, served_name="tiny"),
     ["vllm", "serve", "M", "--served-model-name", "tiny", "--host", "0.0.0.0", "--port", "8001",
      "--max-model-len", "4096", "--max-num-seqs", "4", "--enable-auto-tool-choice", "--tool-call-parser",
      "hermes"]),
    ("sglang", dataclasses.replace(SPEC, served_name="tiny"),
     ["python", "-m", "sglang.launch_server", "--model-path", "M", "--served-model-name", "tiny", "--host",
      "0.0.0.0", "--port", "8001", "--context-length", "4096", "--enable-metrics", "--tool-call-parser", "qwen25"]),
    ("llamacpp", dataclasses.replace(SPEC, served_name="tiny"),
     ["llama-server", "-m", "M", "--alias", "tiny", "--host", "0.0.0.0", "--port", "8001", "-c", "16384",
      "--parallel", "4", "--metrics"]),
    ("lmdeploy", dataclasses.replace(SPEC, served_name="tiny"),
     ["lmdeploy", "serve", "api_server", "M", "--model-name", "tiny", "--server-name", "0.0.0.0",
      "--server-port", "8001", "--session-len", "4096", "--max-batch-size", "4"]),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "spec", "argv"), LAUNCH_CASES)
def test_launch_argv(kind: str, spec: LaunchSpec, argv: list[str]) -> None:
    assert adapter_for(kind).launch_argv(spec) == argv


CAP_FLAGS = {
    "vllm": "--max-model-len",
    "sglang": "--context-length",
    "llamacpp": "-c",
    "trtllm": "--max_seq_len",
    "lmdeploy": "--session-len",
}


@pytest.mark.parametrize("kind", KINDS)
def test_launch_argv_without_a_cap_leaves_the_engine_default(kind: str) -> None:
    argv = adapter_for(kind).launch_argv(dataclasses.replace(SPEC, max_context_tokens=None))
    assert CAP_FLAGS.get(kind, "-c") not in argv
    assert not any("NIM_MAX_MODEL_LEN" in a or "OLLAMA_CONTEXT_LENGTH" in a for a in argv)
    assert all(isinstance(a, str) for a in argv)


# ---------------------------------------------------------------- the registry

HEALTH = {
    "vllm": ("/health", "/metrics"),
    "sglang": ("/health", "/metrics"),
    "llamacpp": ("/health", "/metrics"),
    "trtllm": ("/health", "/prometheus/metrics"),
    "lmdeploy": ("/health", "/metrics"),
    "nim": ("/v1/health/ready", "/v1/metrics"),
    "ollama": ("/api/version", ""),
    "openai": ("/v1/models", ""),
    "sim": ("/health", "/metrics"),
}


@pytest.mark.parametrize("kind", sorted(HEALTH))
def test_adapter_for(kind: str) -> None:
    adapter = adapter_for(kind)
    assert adapter.kind == kind
    assert (adapter.health_path, adapter.metrics_path) == HEALTH[kind]


def test_every_kind_is_known() -> None:
    assert set(KINDS) == set(HEALTH)


@pytest.mark.parametrize("kind", ["", "VLLM", "tgi", "vllm "])
def test_unknown_kind_raises(kind: str) -> None:
    with pytest.raises(ValueError, match="unknown engine kind") as info:
        adapter_for(kind)
    assert "llamacpp" in str(info.value)


def test_adapters_are_immutable() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        adapter_for("vllm").health_path = "/x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        ADAPTERS["vllm"] = ADAPTERS["sglang"]  # type: ignore[index]


MY_MODULES = ["adapters", "base", "llamacpp", "openai", "promtext", "sglang", "vllm"]


@pytest.mark.parametrize("module", MY_MODULES)
def test_adapters_never_import_the_gateway(module: str) -> None:
    tree = ast.parse((ENGINES_DIR / f"{module}.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            continue
        assert not any(n == "gateway" or n.startswith("gateway.") for n in names)


def test_error_messages_do_not_leak_file_paths() -> None:
    """A real SGLang 400 embeds a traceback line naming its install directory."""
    body = json.dumps(
        {
            "object": "error",
            "type": "BadRequestError",
            "code": 400,
            "param": None,
            "message": 'File "/root/venv/lib/python3.11/site-packages/sglang/srt/x.py", line 3: bad',
        }
    )
    norm = adapter_for("sglang").normalise_error(400, body.encode())
    assert "/root" not in norm.message and "site-packages" not in norm.message


@pytest.mark.parametrize(
    ("model", "vllm", "sglang"),
    [
        ("Qwen/Qwen3-Coder-30B-A3B-Instruct", "qwen3_coder", "qwen3_coder"),
        ("Qwen/Qwen3-0.6B", "hermes", "qwen25"),
        ("meta-llama/Llama-3.1-8B-Instruct", "llama3_json", "llama3"),
        ("openai/gpt-oss-20b", "openai", "gpt-oss"),
        ("some/unknown-model", "hermes", "qwen25"),
    ],
)
def test_plan_names_the_tool_call_parser_of_the_models_family(model: str, vllm: str, sglang: str) -> None:
    from engines.table import tool_parser

    assert tool_parser(model, "vllm") == vllm
    assert tool_parser(model, "sglang") == sglang


def test_vllms_refusal_without_a_tool_parser_names_the_flags() -> None:
    message = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
    body = json.dumps({"error": {"message": message, "type": "BadRequestError", "code": 400}}).encode()
    error = ADAPTERS["vllm"].normalise_error(400, body)
    assert error.status == 400
    assert "--tool-call-parser NAME" in error.message and "gateway plan" in error.message
