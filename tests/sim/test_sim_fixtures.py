"""The simulator against recordings of the real engines.

- ``tests/fixtures/engines/llamacpp_*.metrics.txt`` (a real llama-server): the sim's llama.cpp metric names
  must be exactly the real ones.
- ``tests/fixtures/{vllm,llamacpp}/`` (written by ``tests/engines/record_fixtures.py``): every recorded
  exchange is replayed against a sim of that flavour, and ``compare_with_recording`` checks status,
  content type and JSON key structure. Until a recording exists, those tests skip and say so; the
  comparison machinery itself is tested here on the sim's own output, so it is ready when they land.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from sim_helpers import SimFactory, metric_names, sse_payloads

from engines.sim import SimServer

pytestmark = pytest.mark.live

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# Settings the recordings were made with (tests/engines/record_fixtures.py): llama.cpp 512-token slots,
# vLLM max_model_len 1024.
RECORDED_CONTEXT = {"vllm": 1024, "llamacpp": 512}
# Exchanges the sim does not imitate (engine-specific introspection, or timing measurements).
NOT_SIMULATED = {"props", "detokenize", "health_loading", "meta", "measurements"}
# Keys real engines send that the sim leaves out on purpose (the gateway never reads them).
REAL_ONLY_OK = {"system_fingerprint", "service_tier", "kv_transfer_params", "prompt_logprobs", "refusal",
                "annotations", "audio", "function_call", "reasoning", "reasoning_content", "token_ids",
                "prompt_token_ids", "generation_settings", "models"}  # fmt: skip
# Introspection whose many fields the sim only samples: here only keys the sim invents are problems.
SAMPLED = {"slots_idle", "slots_busy", "slots_after_disconnect", "models"}


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


def sse_events(raw: bytes) -> list[Any]:
    return [json.loads(p) for p in sse_payloads(raw) if p != "[DONE]"]


def compare_structure(real: Any, sim: Any, where: str, sampled: bool = False) -> list[str]:
    """Differences that matter: keys the sim invents, and keys the real engine has that the sim lacks
    (unless listed in REAL_ONLY_OK, or ``sampled``)."""
    real_paths, sim_paths = key_paths(real), key_paths(sim)
    problems = [f"{where}: sim invents {p}" for p in sorted(sim_paths - real_paths)]
    if sampled:
        return problems
    missing = {p for p in real_paths - sim_paths if p.rsplit(".", 1)[-1] not in REAL_ONLY_OK}
    problems += [f"{where}: sim lacks {p}" for p in sorted(missing)]
    return problems


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
    malformed_ok = name == "error_malformed_json" and {rec["status"], r.status_code} <= {400, 500}
    if r.status_code != rec["status"] and not malformed_ok:
        problems.append(f"{name}: status {r.status_code}, recorded {rec['status']}")
    real_type = rec["headers"].get("content-type", "").split(";")[0]
    if real_type and r.headers.get("content-type", "").split(";")[0] != real_type:
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


@pytest.mark.parametrize("flavour", ["vllm", "llamacpp"])
async def test_recorded_metric_names_are_simulated(make_sim: SimFactory, flavour: str) -> None:
    path = FIXTURES / flavour / "metrics.txt"
    if not path.is_file():
        pytest.skip(f"no tests/fixtures/{flavour}/metrics.txt yet")
    sim = await make_sim(flavour)
    async with httpx.AsyncClient(base_url=sim.base_url) as client:
        ours = metric_names((await client.get("/metrics")).text)
    wanted = {n for n in metric_names(path.read_text()) if n.startswith(f"{flavour}:")}
    important = {n for n in wanted if not n.endswith(("_seconds", "_created", "_info")) or "cache" in n}
    assert important - ours == set()


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
    (tmp_path / "chat_stream.json").write_text(json.dumps({
        "request": {"method": "POST", "path": "/v1/chat/completions", "body": stream}, "status": 200,
        "headers": {"content-type": "text/event-stream"}, "body_file": "chat_stream.sse.txt"}))  # fmt: skip
    assert await compare_with_recording(sim, tmp_path / "chat.json") == []
    assert await compare_with_recording(sim, tmp_path / "chat_stream.json") == []

    tampered = json.loads((tmp_path / "chat.json").read_text())
    tampered["status"] = 201
    tampered["body"]["usage"]["extra_real_field"] = 1
    del tampered["body"]["choices"][0]["finish_reason"]
    (tmp_path / "chat.json").write_text(json.dumps(tampered))
    problems = await compare_with_recording(sim, tmp_path / "chat.json")
    assert any("status 200, recorded 201" in p for p in problems)
    assert any("lacks usage.extra_real_field" in p for p in problems)
    assert any("invents choices.[].finish_reason" in p for p in problems)
    usage_dropped = s.content.replace(b',"usage":{', b',"usage_renamed":{')
    (tmp_path / "chat_stream.sse.txt").write_bytes(usage_dropped)
    problems = await compare_with_recording(sim, tmp_path / "chat_stream.json")
    assert any("last event: sim invents usage" in p for p in problems)
