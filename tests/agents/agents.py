"""How the tests run the real coding agents, headless, against a base URL: Claude Code (`claude -p`)
and Codex CLI (`codex exec`), each in a home and a working folder of its own, with nothing of the
machine's own configuration. Used by the agent tests and by record.py, which records their requests.

Claude Code reads ANTHROPIC_BASE_URL and ANTHROPIC_MODEL; Codex reads a provider from
$CODEX_HOME/config.toml (wire_api = "responses"). docs/agents.md says the same for users."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TOOL_FILE = "hello.txt"
TOOL_TEXT = "gateway-tool-result-42"
"""What the scripted tool call reads: the agent's next request must carry it back."""


def agents_bin() -> Path | None:
    """The folder with `claude` and `codex` that tests/agents/setup.sh installed, or None."""
    cache = Path(os.environ.get("GATEWAY_CI_CACHE", Path.home() / ".cache" / "gateway-ci"))
    pins = json.loads((HERE / "package.json").read_text())["dependencies"]
    folder = cache / f"agents-{pins['@anthropic-ai/claude-code']}-{pins['@openai/codex']}" / "node_modules" / ".bin"
    return folder if (folder / "claude").exists() and (folder / "codex").exists() else None


def pinned_versions() -> dict[str, str]:
    pins: dict[str, str] = json.loads((HERE / "package.json").read_text())["dependencies"]
    return pins


EMPTY_ANSWER_REMINDER = "no visible output"
"""What Claude Code adds to the conversation when it asks again after an answer with no text."""


@dataclass
class AgentRun:
    returncode: int
    stdout: str
    stderr: str
    home: Path | None = None
    """The agent's HOME (its session transcripts), for runs made here."""

    def claude_empty_answer_retries(self) -> int:
        """How often Claude Code asked again because an answer had no visible text (the random-weight
        model can end a turn at its first token), read from its session transcript."""
        if self.home is None:
            return 0
        retries = 0
        for transcript in (self.home / ".claude" / "projects").glob("*/*.jsonl"):
            for line in transcript.read_text(errors="replace").splitlines():
                entry = json.loads(line) if line.startswith("{") else {}
                if entry.get("type") == "user" and EMPTY_ANSWER_REMINDER in json.dumps(entry.get("message")):
                    retries += 1
        return retries

    def claude_result(self) -> dict[str, Any]:
        """Claude Code's --output-format json result (its last JSON line)."""
        for line in reversed(self.stdout.splitlines()):
            if line.startswith("{"):
                value: dict[str, Any] = json.loads(line)
                return value
        raise AssertionError(f"no JSON result from claude: {self.stdout[-2000:]} {self.stderr[-2000:]}")

    def codex_events(self) -> list[dict[str, Any]]:
        """Codex's --json events, one a line."""
        return [json.loads(line) for line in self.stdout.splitlines() if line.startswith("{")]


def workspace(root: Path) -> tuple[Path, Path]:
    """(home, cwd) under root: an empty home, and a working folder holding the tool's file."""
    home, cwd = root / "home", root / "work"
    home.mkdir(parents=True, exist_ok=True)
    cwd.mkdir(parents=True, exist_ok=True)
    (cwd / TOOL_FILE).write_text(TOOL_TEXT + "\n")
    return home, cwd


def _base_env(home: Path) -> dict[str, str]:
    keep = ("PATH", "LANG", "TERM", "TMPDIR", "SSL_CERT_FILE")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env["HOME"] = str(home)
    return env


def run_claude(
    bin_dir: Path,
    base_url: str,
    model: str | None,
    prompt: str,
    root: Path,
    *,
    allowed_tools: str = "",
    timeout: float = 300,
) -> AgentRun:
    """`model` None: Claude Code's own default model names, as a user who sets only the base URL gets."""
    home, cwd = workspace(root)
    env = _base_env(home)
    env.update(
        {
            "ANTHROPIC_BASE_URL": base_url,
            "ANTHROPIC_API_KEY": "sk-gateway-test",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
        }
    )
    if model is not None:
        env.update({"ANTHROPIC_MODEL": model, "ANTHROPIC_SMALL_FAST_MODEL": model})
        env["ANTHROPIC_DEFAULT_HAIKU_MODEL"] = model
    argv = [str(bin_dir / "claude"), "-p", prompt, "--output-format", "json"]
    if allowed_tools:
        argv += ["--allowedTools", allowed_tools]
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    return AgentRun(done.returncode, done.stdout, done.stderr, home)


def codex_config(base_url: str, model: str) -> str:
    return (
        f'model = "{model}"\n'
        'model_provider = "gateway"\n\n'
        "[model_providers.gateway]\n"
        'name = "gateway"\n'
        f'base_url = "{base_url}/v1"\n'
        'wire_api = "responses"\n'
        'env_key = "GATEWAY_API_KEY"\n'
    )


def run_codex(bin_dir: Path, base_url: str, model: str, prompt: str, root: Path, *, timeout: float = 300) -> AgentRun:
    home, cwd = workspace(root)
    codex_home = home / ".codex"
    codex_home.mkdir(exist_ok=True)
    (codex_home / "config.toml").write_text(codex_config(base_url, model))
    env = _base_env(home)
    env.update({"CODEX_HOME": str(codex_home), "GATEWAY_API_KEY": "sk-gateway-test"})
    argv = [str(bin_dir / "codex"), "exec", "--skip-git-repo-check", "--json", prompt]
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    return AgentRun(done.returncode, done.stdout, done.stderr)


def codex_failed(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Codex's events that report a failed turn (its warnings are items of type error: not these)."""
    return [e for e in events if e.get("type") in ("turn.failed", "error")]
