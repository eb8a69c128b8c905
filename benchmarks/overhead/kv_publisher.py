"""Stands in for two engines' KV-event publishers in the overhead benchmark (peers.py's
`gateway~kv_events` peer): the events of every request the upstream nginx served, published as an
engine publishes them, one batch per engine step.

nginx writes one access-log line per request to the json location; this process reads the log every
`--step-ms` and publishes, on each engine's socket, one batch with the events of the requests logged
since (kvevents.py: a request's full blocks, prompt and generated tokens, stored; those of the request
`--keep` places before removed), the requests dealt to the two engines in turn, each engine numbering
its own batches from 0. So the gateway under test decodes and indexes every request's events, at
whatever rate the load runs, as it would in front of engines whose caches are full.

vLLM publishes the events of one scheduler step as one batch; a step is a few to a few tens of
milliseconds on a GPU, so 10 ms (the default) is a short step. `--step-ms 0` publishes a batch per
request: the dearest case, each batch's fixed cost paid by one request.

    kv_publisher.py --log FILE --ports P1,P2 --body REQUEST.json [--tokenizer DIR] [--step-ms MS]

Binds `tcp://127.0.0.1:P` for each port (an engine's `tcp://*:P`); the gateway connects. The ids in
the events are the request's prompt as the pool's tokenizer encodes it (without one, filler ids of
the same length: the gateway then matches nothing, as it would not know the prompt's ids either).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, run as a script
from benchmarks.overhead import kvevents

IDLE_S = 0.0005
"""With --step-ms 0: how often the log is read (a batch follows its request closely)."""


def prompt_ids(body: Path, tokenizer: str) -> list[int]:
    messages = json.loads(body.read_bytes())["messages"]
    if tokenizer:
        from gateway.pipeline.chat_tokenizer import ChatTokenizer  # the gateway's own encoder

        ids = ChatTokenizer.load(tokenizer).ids({"messages": messages})
        if ids is not None:
            return ids
    return [7] * (sum(len(m["content"]) for m in messages) // 3)


def cycle(ids: list[int], keep: int) -> list[list[dict[str, Any]]]:
    """2 x keep requests' events, reused in turn: request j stores its blocks under hashes of its own
    and removes those of request j - keep (mod 2 x keep), which went to the same engine (keep even)."""
    period = 2 * keep
    blocks = (len(ids) + kvevents.GENERATED) // kvevents.BLOCK_SIZE
    hashes = [list(range(1 + j * blocks, 1 + (j + 1) * blocks)) for j in range(period)]
    return [
        kvevents.events(ids, kvevents.GENERATED, 1 + j * blocks, hashes[(j - keep) % period]) for j in range(period)
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--log", type=Path, required=True, help="nginx's access log of the json location")
    p.add_argument("--ports", required=True, help="comma-separated: one PUB port per engine")
    p.add_argument("--body", type=Path, required=True, help="the request body the load sends")
    p.add_argument("--tokenizer", default="", help="the pool's tokenizer folder")
    p.add_argument("--step-ms", type=float, default=10, help="an engine step: one batch each (0: one a request)")
    p.add_argument("--keep", type=int, default=1500, help="requests whose blocks each engine holds (even)")
    a = p.parse_args()
    ctx = zmq.Context()
    sockets = []
    for port in a.ports.split(","):
        sock = ctx.socket(zmq.PUB)
        sock.setsockopt(zmq.SNDHWM, 100_000)
        sock.bind(f"tcp://127.0.0.1:{port}")
        sockets.append(sock)
    requests = cycle(prompt_ids(a.body, a.tokenizer), a.keep)
    running = True

    def stop(*_: object) -> None:
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    a.log.touch()
    served = 0
    seqs = [0] * len(sockets)
    step_s = a.step_ms / 1e3 if a.step_ms > 0 else IDLE_S
    with a.log.open("rb") as log:
        log.seek(0, 2)  # only requests from now on
        while running:
            time.sleep(step_s)
            lines = log.read().count(b"\n")
            per_engine: list[list[list[dict[str, Any]]]] = [[] for _ in sockets]
            for r in range(served, served + lines):
                per_engine[r % len(sockets)].append(requests[r % len(requests)])
            served += lines
            for engine, batches in enumerate(per_engine):
                # One batch for the step, or (step 0) one per request.
                groups = [[e for req in batches for e in req]] if a.step_ms > 0 and batches else batches
                for group in groups:
                    sockets[engine].send_multipart(kvevents.frames(seqs[engine], group))
                    seqs[engine] += 1
    print(json.dumps({"requests": served, "batches": sum(seqs)}), flush=True)


if __name__ == "__main__":
    main()
