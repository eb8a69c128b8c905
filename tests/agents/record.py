"""Record what the real coding agents send, as fixtures for the differential replay
(tests/integration/test_agents.py). Re-record when an agent releases:

    bash tests/engines/setup.sh llamacpp && bash tests/agents/setup.sh   # or GATEWAY_AGENTS=latest
    python tests/agents/record.py [--out tests/fixtures/agents]

Each agent runs headless against the recording proxy (scripted.py) in front of a real llama-server
on the agent model (64k window). Scenarios: a first turn with the agent's whole tool list, and a turn
that carries a tool's result (the proxy answers the first request with a scripted tool call; the
agent runs the tool and sends the result). Every request the agent makes is kept, side requests
included. `claude_count_tokens` is derived from the first turn's body (the count_tokens body is the
request's own fields less the generation settings), as headless Claude Code does not count.
Local paths, the user's name and machine identifiers are scrubbed (scrub())."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.agents.agents import (  # noqa: E402
    TOOL_FILE,
    agents_bin,
    pinned_versions,
    run_claude,
    run_codex,
)
from tests.agents.scripted import READY_PATH  # noqa: E402
from tests.engines import servers  # noqa: E402

WORKSPACE = "/workspace"
HOME = "/home/user"
_UUIDS = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
_HEX64 = re.compile(r"\b[0-9a-f]{64}\b")
COUNT_TOKENS_FIELDS = ("model", "messages", "system", "tools", "tool_choice", "thinking")


def scrub(value: Any, replacements: list[tuple[str, str]]) -> Any:
    """Paths and names replaced, identifiers made stable: the same id in one recording stays the
    same (so a session id still matches between the header and the body), different ids differ."""
    text = json.dumps(value, ensure_ascii=False)
    for old, new in replacements:
        text = text.replace(old, new)
    seen: dict[str, str] = {}

    def stable(match: re.Match[str]) -> str:
        found = match.group(0)
        if found not in seen:
            n = len(seen) + 1
            seen[found] = f"00000000-0000-4000-8000-{n:012d}" if "-" in found else f"{n:064x}"
        return seen[found]

    text = _UUIDS.sub(stable, text)
    text = _HEX64.sub(stable, text)
    return json.loads(text)


def start_proxy(upstream: str, port: int, folder: Path, tool_call: str | None) -> subprocess.Popen[bytes]:
    argv = [sys.executable, str(ROOT / "tests/agents/scripted.py"), "--upstream", upstream, "--port", str(port)]
    argv += ["--record", str(folder)]
    if tool_call:
        argv += ["--tool-call", tool_call]
    proxy = subprocess.Popen(argv, start_new_session=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}{READY_PATH}", timeout=1)
            return proxy
        except httpx.TransportError:
            time.sleep(0.1)
    proxy.kill()
    raise RuntimeError("the recording proxy did not start")


def record(out: Path) -> None:
    bin_dir = agents_bin()
    if bin_dir is None:
        raise SystemExit("the agents are not installed: bash tests/agents/setup.sh")
    versions = pinned_versions()
    engine = servers.start_llamacpp(model_key="TINY_AGENT_GGUF", ctx_per_slot=65536, parallel=1)
    try:
        with tempfile.TemporaryDirectory(prefix="agent-record-") as tmp:
            root = Path(tmp)
            scenarios = [
                ("claude_first_turn", "claude", "hi", None),
                ("claude_tool_result", "claude", "Please use the tool Read on hello.txt", "Read"),
                ("codex_first_turn", "codex", "hi", None),
                ("codex_tool_result", "codex", "Please use the tool exec_command to cat hello.txt", "exec_command"),
            ]
            out.mkdir(parents=True, exist_ok=True)
            for old in out.glob("*.json"):
                old.unlink()
            for name, agent, prompt, tool in scenarios:
                folder, work = root / name / "requests", root / name / "run"
                port = servers.free_port()
                arguments = None
                if tool == "Read":
                    arguments = f"Read:{json.dumps({'file_path': str(work / 'work' / TOOL_FILE)})}"
                elif tool == "exec_command":
                    arguments = f"exec_command:{json.dumps({'cmd': 'cat ' + TOOL_FILE})}"
                proxy = start_proxy(engine.base_url, port, folder, arguments)
                try:
                    base = f"http://127.0.0.1:{port}"
                    if agent == "claude":
                        run = run_claude(bin_dir, base, None, prompt, work, allowed_tools=tool or "")
                        version = f"@anthropic-ai/claude-code {versions['@anthropic-ai/claude-code']}"
                    else:
                        run = run_codex(bin_dir, base, "gpt-5.2-codex", prompt, work)
                        version = f"@openai/codex {versions['@openai/codex']}"
                    if run.returncode != 0:
                        raise SystemExit(f"{name}: the agent failed: {run.stdout[-2000:]} {run.stderr[-2000:]}")
                finally:
                    proxy.terminate()
                    proxy.wait(10)
                replacements = [(str(work / "work"), WORKSPACE), (str(work / "home"), HOME), (str(work), HOME)]
                for i, path in enumerate(sorted(folder.glob("*.json")), 1):
                    request = scrub(json.loads(path.read_text()), replacements)
                    fixture = {
                        "agent": version,
                        "scenario": name,
                        "recorded": datetime.now(UTC).strftime("%Y-%m-%d"),
                        "request": request,
                    }
                    target = out / f"{name}-{i:02d}.json"
                    target.write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n")
                    print(f"wrote {target.relative_to(ROOT)}: {request['method']} {request['path']}")
            first = json.loads((out / "claude_first_turn-01.json").read_text())
            body = {k: v for k, v in first["request"]["body"].items() if k in COUNT_TOKENS_FIELDS}
            request = {**first["request"], "path": "/v1/messages/count_tokens", "body": body}
            derived = {**first, "scenario": "claude_count_tokens", "derived_from": "claude_first_turn-01.json"}
            derived["request"] = request
            (out / "claude_count_tokens-01.json").write_text(json.dumps(derived, indent=1, ensure_ascii=False) + "\n")
    finally:
        engine.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "tests/fixtures/agents")
    record(parser.parse_args().out)


if __name__ == "__main__":
    main()
