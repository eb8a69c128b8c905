"""The simulator against recordings of the real engines.

- ``tests/fixtures/engines/llamacpp_*.metrics.txt`` (a real llama-server): the sim's llama.cpp metric names
  must be exactly the real ones.
- ``tests/fixtures/{vllm,llamacpp}/`` (written by ``tests/engines/record_fixtures.py``): every recorded
  exchange is replayed against a sim of that flavour, and ``compare_with_recording`` checks the status, the
  content type, the JSON key structure (every key, both ways) and the protocol values (``object``, ``type``,
  ``param``, ``code``, ``finish_reason``, ``role``). Ids, timestamps, counts and text differ by nature and
  are not compared. Until a recording exists, those tests skip and say so; the comparison machinery itself
  is tested here on the sim's own output.
- ``metrics.txt`` of each recording: see ``test_recorded_metric_names_are_simulated``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest

from engines import llamacpp, vllm
from engines.promtext import LoadTable
from engines.sim.server import SimServer
from tests.sim.sim_helpers import CHAT_PATH, SimFactory, chat_body, metric_names, sse_payloads

pytestmark = pytest.mark.live

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
# Settings the recordings were made with (tests/engines/record_fixtures.py): llama.cpp 512-token slots,
# vLLM max_model_len 1024.
RECORDED_CONTEXT = {"vllm": 1024, "llamacpp": 512}
# Exchanges the sim does not imitate (engine-specific introspection, or timing measurements).
NOT_SIMULATED = {"props", "detokenize", "health_loading", "meta", "measurements"}
# A busy llama.cpp slot's "params" holds some forty sampling settings; the sim sends a busy slot's task
# fields but not those, so for /slots only keys the sim invents are problems.
SAMPLED = {"slots_idle", "slots_busy", "slots_after_disconnect"}
# Keys whose values are protocol, not content: compared wherever both sides have them.
PROTOCOL_KEYS = {"object", "type", "param", "code", "finish_reason", "role"}


def key_paths(obj: Any, prefix: str = "") -> set[str]:
    """Dotted paths of every object key; list items are merged under ``[]``."""
    out: set[str] = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.add(prefix + k)
            out |= key_paths(v, prefix + k + ".")
    elif isinstance(obj, list):
        for item in obj:
            out |= key_paths(item, prefix + "[].")
    return out


def protocol_values(obj: Any, prefix: str = "") -> dict[str, set[str]]:
    """The values (as JSON) under PROTOCOL_KEYS, by dotted path; list items are merged under ``[]``."""
    out: dict[str, set[str]] = {}
    items = obj.items() if isinstance(obj, dict) else (("[]", v) for v in obj) if isinstance(obj, list) else ()
    for k, v in items:
        if isinstance(v, (dict, list)):
            for path, values in protocol_values(v, prefix + k + ".").items():
                out.setdefault(path, set()).update(values)
        elif k in PROTOCOL_KEYS:
            out.setdefault(prefix + k, set()).add(json.dumps(v))
    return out


def sse_events(raw: bytes) -> list[Any]:
    return [json.loads(p) for p in sse_payloads(raw) if p != "[DONE]"]


def compare_structure(real: Any, sim: Any, where: str, sampled: bool = False) -> list[str]:
    """Differences that matter: keys the sim invents, keys the real engine has that the sim lacks (unless
    ``sampled``), and protocol values that differ."""
    real_paths, sim_paths = key_paths(real), key_paths(sim)
    problems = [f"{where}: sim invents {p}" for p in sorted(sim_paths - real_paths)]
    if not sampled:
        problems += [f"{where}: sim lacks {p}" for p in sorted(real_paths - sim_paths)]
    real_values, sim_values = protocol_values(real), protocol_values(sim)
    for path in sorted(real_values.keys() & sim_values.keys()):
        if real_values[path] != sim_values[path]:
            problems.append(f"{where}: {path} is {sorted(sim_values[path])}, recorded {sorted(real_values[path])}")
    return problems


def _content_type(value: str) -> str:
    return value.replace(" ", "").lower()


async def compare_with_recording(sim: SimServer, recording: Path) -> list[str]:
    """Replay one recorded exchange (NAME.json, maybe with NAME.sse.txt) against ``sim``; return problems."""
    rec = json.loads(recording.read_text())
    req = rec["request"]
    body = req.get("body")
    content = body.encode() if isinstance(body, str) else None
    async with httpx.AsyncClient(base_url=sim.base_url, timeout=30) as client:
        r = await client.request(req["method"], req["path"], json=None if content is not None else body,
                                 content=content, headers={"content-type": "application/json"})  # fmt: skip
    name = recording.stem
    problems = []
    if r.status_code != rec["status"]:
        problems.append(f"{name}: status {r.status_code}, recorded {rec['status']}")
    real_type = rec["headers"].get("content-type", "")
    if _content_type(r.headers.get("content-type", "")) != _content_type(real_type):
        problems.append(f"{name}: content-type {r.headers.get('content-type')!r}, recorded {real_type!r}")
    if "body_file" in rec:
        real_events = sse_events((recording.parent / rec["body_file"]).read_bytes())
        sim_events = sse_events(r.content)
        if bool(real_events) != bool(sim_events):
            return [*problems, f"{name}: recorded {len(real_events)} events, sim sent {len(sim_events)}"]
        # The opening event, a middle one and the last two (finish and usage) carry every shape.
        for label, index in (("first", 0), ("middle", len(real_events) // 2), ("second last", -2), ("last", -1)):
            if len(real_events) >= abs(index) + (index >= 0):
                sim_index = index if index < 0 else min(index, len(sim_events) - 1)
                problems += compare_structure(real_events[index], sim_events[sim_index], f"{name} {label} event")
    elif isinstance(rec.get("body"), (dict, list)):
        try:
            problems += compare_structure(rec["body"], r.json(), name, sampled=name in SAMPLED)
        except ValueError:
            problems.append(f"{name}: sim body is not JSON")
    elif r.content.decode("utf-8", "replace") != rec.get("body", ""):
        problems.append(f"{name}: body {r.content[:80]!r}, recorded {rec.get('body', '')[:80]!r}")
    return problems


def recordings(flavour: str) -> list[Path]:
    folder = FIXTURES / flavour
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("*.json") if p.stem not in NOT_SIMULATED)


@pytest.mark.parametrize("flavour", ["vllm", "llamacpp"])
async def test_sim_matches_recorded_engine(make_sim: SimFactory, flavour: str) -> None:
    found = recordings(flavour)
    if not found:
        pytest.skip(f"no recordings in tests/fixtures/{flavour}/ yet (tests/engines/record_fixtures.py)")
    sim = await make_sim(flavour, base_step_s=0.0002, per_seq_step_s=0.0, context_limit=RECORDED_CONTEXT[flavour])
    problems = [p for path in found for p in await compare_with_recording(sim, path)]
    assert not problems, "\n".join(problems)


# --- metrics ---------------------------------------------------------------------------------------------

# The metric names /work/shared/ENGINES.md lists for each engine (test_engines_md_lists_these_metrics keeps
# this in step with it where the file is at hand). Its "older versions used" names are not in a recording
# of the current version, so they are not here.
ENGINES_MD_METRICS = {
    "vllm": {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
             "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_cached_total",
             "vllm:num_preemptions_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
             "vllm:request_success_total", "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
             "vllm:e2e_request_latency_seconds", "vllm:cache_config_info"},
    "llamacpp": {"llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total",
                 "llamacpp:prompt_tokens_cached_total", "llamacpp:n_decode_total", "llamacpp:requests_processing",
                 "llamacpp:requests_deferred", "llamacpp:n_busy_slots_per_decode"},
}  # fmt: skip
ENGINES_MD_OLD_NAMES = {"vllm:gpu_cache_usage_perc"}
# What the gateway reads from each engine's /metrics (engines/vllm.py, engines/llamacpp.py).
ADAPTER_TABLES: dict[str, LoadTable] = {"vllm": vllm.LOAD, "llamacpp": llamacpp.LOAD}
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="(?:[^"\\]|\\.)*"')


class Family(NamedTuple):
    type: str
    help: str
    labels: frozenset[str]


def families(text: str) -> dict[str, Family]:
    """Each metric family's TYPE, HELP and label names (over all its samples; a histogram's include le)."""
    types: dict[str, str] = {}
    helps: dict[str, str] = {}
    labels: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith(("# TYPE ", "# HELP ")):
            _, kind, name, *rest = line.split(" ", 3)
            (types if kind == "TYPE" else helps)[name] = rest[0] if rest else ""
        elif line and not line.startswith("#"):
            name, _, label_text = line.split(" ")[0].partition("{") if "{" in line else (line.split()[0], "", "")
            if name not in types:
                name = re.sub(r"_(bucket|count|sum)$", "", name)
            labels.setdefault(name, set()).update(_LABEL.findall(label_text))
    return {n: Family(t, helps.get(n, ""), frozenset(labels.get(n, ()))) for n, t in types.items()}


def relied_on(flavour: str, recorded: dict[str, Family]) -> AbstractSet[str]:
    """The adapter table's names that this engine version sends, plus ENGINES.md's names. Fails when a load
    signal the table reads has none of its names (current or fallback) in the recording."""
    table = ADAPTER_TABLES[flavour]
    for signal in (table.running, table.waiting, table.kv_usage):
        assert not signal or set(signal) & recorded.keys(), f"the recording has none of {signal}"
    hit_names = {n for r in table.hit_ratios for n in (r.hits, r.base) if {r.hits, r.base} <= recorded.keys()}
    assert not (table.hit_ratios or table.hit_rate) or hit_names or set(table.hit_rate) & recorded.keys()
    return (table.wanted & recorded.keys()) | ENGINES_MD_METRICS[flavour]


@pytest.mark.parametrize("flavour", ["vllm", "llamacpp"])
async def test_recorded_metric_names_are_simulated(make_sim: SimFactory, flavour: str) -> None:
    """The sim emits what matters, as the real engine does, and nothing the real engine lacks.

    Decided: the sim does not imitate every metric (vLLM 0.32 sends some 40 families, mostly histograms
    nothing here reads; that would be noise). It must emit (1) every name the gateway's adapter table for
    the engine reads and the recorded version sends, and (2) every name ENGINES.md lists for the engine,
    each with the recorded TYPE and label names. And every family it does emit must be one the real
    engine sends, with the same TYPE, HELP and label names: a sim-only metric would let a gateway test
    pass against a name no real engine has.
    """
    path = FIXTURES / flavour / "metrics.txt"
    if not path.is_file():
        pytest.skip(f"no tests/fixtures/{flavour}/metrics.txt yet")
    recorded = {n: f for n, f in families(path.read_text()).items() if n.startswith(f"{flavour}:")}
    sim = await make_sim(flavour)
    async with httpx.AsyncClient(base_url=sim.base_url) as client:
        await client.post(CHAT_PATH, json=chat_body(max_tokens=3))  # the recording was made after traffic
        ours = families((await client.get("/metrics")).text)

    required = relied_on(flavour, recorded)
    assert ENGINES_MD_METRICS[flavour] - recorded.keys() == set(), "ENGINES.md lists names the engine lacks"
    assert required - ours.keys() == set(), "the sim lacks metrics the gateway or ENGINES.md relies on"
    assert ours.keys() - recorded.keys() == set(), "the sim emits metrics the real engine lacks"
    for name, family in sorted(ours.items()):
        assert family == recorded[name], name


def test_engines_md_lists_these_metrics() -> None:
    """ENGINES_MD_METRICS is what ENGINES.md says, where ENGINES.md is at hand (it is outside the repo)."""
    found = [p for p in (REPO / "shared" / "ENGINES.md", REPO.parent / "shared" / "ENGINES.md") if p.is_file()]
    if not found:
        pytest.skip("ENGINES.md is not at hand")
    named = set(re.findall(r"`((?:vllm|llamacpp):[a-z0-9_]+)", found[0].read_text())) - ENGINES_MD_OLD_NAMES
    assert named == ENGINES_MD_METRICS["vllm"] | ENGINES_MD_METRICS["llamacpp"]


async def test_llamacpp_metric_names_match_the_real_server(make_sim: SimFactory) -> None:
    sim = await make_sim("llamacpp")
    async with httpx.AsyncClient(base_url=sim.base_url) as client:
        ours = (await client.get("/metrics")).text
    for real in sorted((FIXTURES / "engines").glob("llamacpp_*.metrics.txt")):
        assert metric_names(ours) == metric_names(real.read_text()), real.name
        help_lines = [ln for ln in real.read_text().splitlines() if ln.startswith("# HELP")]
        assert help_lines == [ln for ln in ours.splitlines() if ln.startswith("# HELP")]


async def test_comparison_machinery_on_the_sims_own_recording(make_sim: SimFactory, tmp_path: Path) -> None:
    """Record the sim the way record_fixtures.py records a real engine, then compare: no problems; then
    tamper with the recording: the comparison must notice."""
    sim = await make_sim("vllm")
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    stream = {**chat, "stream": True, "stream_options": {"include_usage": True}}
    async with httpx.AsyncClient(base_url=sim.base_url) as client:
        r = await client.post("/v1/chat/completions", json=chat)
        s = await client.post("/v1/chat/completions", json=stream)
    (tmp_path / "chat.json").write_text(json.dumps({
        "request": {"method": "POST", "path": "/v1/chat/completions", "body": chat}, "status": 200,
        "headers": {"content-type": "application/json"}, "body": r.json()}))  # fmt: skip
    (tmp_path / "chat_stream.sse.txt").write_bytes(s.content)
    sse_headers = {"content-type": "text/event-stream; charset=utf-8"}
    (tmp_path / "chat_stream.json").write_text(json.dumps({
        "request": {"method": "POST", "path": "/v1/chat/completions", "body": stream}, "status": 200,
        "headers": sse_headers, "body_file": "chat_stream.sse.txt"}))  # fmt: skip
    assert await compare_with_recording(sim, tmp_path / "chat.json") == []
    assert await compare_with_recording(sim, tmp_path / "chat_stream.json") == []

    tampered = json.loads((tmp_path / "chat.json").read_text())
    tampered["status"] = 201
    tampered["headers"]["content-type"] = "application/json; charset=utf-8"
    tampered["body"]["usage"]["extra_real_field"] = 1
    tampered["body"]["object"] = "chat.completion.v2"
    del tampered["body"]["choices"][0]["finish_reason"]
    (tmp_path / "chat.json").write_text(json.dumps(tampered))
    problems = await compare_with_recording(sim, tmp_path / "chat.json")
    assert any("status 200, recorded 201" in p for p in problems)
    assert any("content-type 'application/json', recorded 'application/json; charset=utf-8'" in p for p in problems)
    assert any("lacks usage.extra_real_field" in p for p in problems)
    assert any("invents choices.[].finish_reason" in p for p in problems)
    assert any("object is ['\"chat.completion\"'], recorded ['\"chat.completion.v2\"']" in p for p in problems)
    usage_dropped = s.content.replace(b',"usage":{', b',"usage_renamed":{')
    (tmp_path / "chat_stream.sse.txt").write_bytes(usage_dropped)
    problems = await compare_with_recording(sim, tmp_path / "chat_stream.json")
    assert any("last event: sim invents usage" in p for p in problems)
