"""The official openai Node SDK against the gateway in front of the simulator: its embeddings call
asks for base64 by default and decodes it itself; a simulator that ignored encoding_format and sent
floats handed older SDKs (4.x) vectors of zeros, silently. Checked: the decoded vectors,
and what came over the wire."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest

from engines.sim.text import EMBEDDING_DIM, embedding
from tests.live.conftest import StackFactory

pytestmark = pytest.mark.live

NODE_DIR = Path(__file__).resolve().parents[1] / "node"


async def node_openai() -> Path:
    """The SDK's install directory (tests/node/setup.sh installs it into the CI cache once)."""
    proc = await asyncio.create_subprocess_exec(
        "bash", str(NODE_DIR / "setup.sh"), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=300)
    assert proc.returncode == 0, f"could not install the openai Node SDK: {err.decode()[-2000:]}"
    return Path(out.decode().strip())


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed (CI has it)")
async def test_node_sdk_embeddings_through_the_gateway(make_stack: StackFactory) -> None:
    sdk = await node_openai()
    stack = await make_stack()
    env = {**os.environ, "GATEWAY_URL": stack.base_url, "MODEL": "tiny", "NODE_PATH": str(sdk / "node_modules")}
    proc = await asyncio.create_subprocess_exec(
        "node",
        str(NODE_DIR / "embeddings.cjs"),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0, err.decode()[-2000:]
    result = json.loads(out)
    inputs = ["hello", "a second, longer input"]
    for vectors in (result["base64"], result["float"]):
        assert [len(v) for v in vectors] == [EMBEDDING_DIM] * 2
        assert all(any(x != 0 for x in v) for v in vectors)
        for vector, text in zip(vectors, inputs, strict=True):
            assert vector == pytest.approx(embedding(text), abs=1e-6)
    # The SDK asked for base64 by default, and got base64 strings on the wire (not floats it would
    # have to tolerate); the second call asked for floats.
    assert result["wire"] == ["string", "string"]
    asked = [r.body.get("encoding_format") for r in stack.sims["vllm-0"].stats.recent if r.path == "/v1/embeddings"]
    assert asked == ["base64", "float", "base64"]
