"""The build. Plain `pip install .` (or `-e .`) installs the gateway as Python. With
GATEWAY_COMPILE=1 the modules of the request path are compiled to C extensions with mypyc, the
compiler that ships with mypy (the code is already typed for `mypy --strict`): the same source, about
0.75x the CPU per request of the Python install (docs/benchmarks.md, "Compiled build: what it
removes"). That needs a C compiler, and mypy with the gateway's own dependencies (mypyc
type-checks the code first) in the build environment:

    pip install . 'mypy>=1.10' setuptools wheel types-PyYAML
    GATEWAY_COMPILE=1 pip install --no-build-isolation --no-deps --force-reinstall .

It never builds in place (an editable install, `develop`, `build_ext --inplace`): a compiled module
would shadow every later edit of its source.
Why each module outside COMPILED stays Python: docs/design.md, "A compiled build"."""

from __future__ import annotations

import os
import sys

from setuptools import setup

COMPILED = [
    "gateway/asgi.py",
    "gateway/deadlines.py",
    "gateway/metric_types.py",
    "gateway/metrics.py",
    "gateway/access/gate.py",
    "gateway/access/keys.py",
    "gateway/access/limiter.py",
    "gateway/fleet/capacity.py",
    "gateway/fleet/registry.py",
    "gateway/pipeline/accounting.py",
    "gateway/pipeline/admission.py",
    "gateway/pipeline/attempts.py",
    "gateway/pipeline/body.py",
    "gateway/pipeline/endpoint.py",
    "gateway/pipeline/enforcer.py",
    "gateway/pipeline/exchange.py",
    "gateway/pipeline/headers.py",
    "gateway/pipeline/relay.py",
    "gateway/pipeline/router.py",
    "gateway/pipeline/stored.py",
    "gateway/pipeline/token_memo.py",
    "gateway/policy/balancer.py",
    "gateway/policy/blockkeys.py",
    "gateway/policy/cached_prefix.py",
    "gateway/policy/caps.py",
    "gateway/policy/fairqueue.py",
    "gateway/policy/kv.py",
    "gateway/policy/models.py",
    "gateway/policy/prefix.py",
    "gateway/policy/priority.py",
    "gateway/policy/rules.py",
    "gateway/protocols/anthropic_errors.py",
    "gateway/protocols/base.py",
    "gateway/protocols/catalog.py",
    "gateway/protocols/chat.py",
    "gateway/protocols/chat_stream.py",
    "gateway/protocols/completions.py",
    "gateway/protocols/dropped.py",
    "gateway/protocols/edits.py",
    "gateway/protocols/embeddings.py",
    "gateway/protocols/events.py",
    "gateway/protocols/frames.py",
    "gateway/protocols/inbound.py",
    "gateway/protocols/messages.py",
    "gateway/protocols/messages_native.py",
    "gateway/protocols/messages_reply.py",
    "gateway/protocols/messages_stream.py",
    "gateway/protocols/messages_translate.py",
    "gateway/protocols/native_observers.py",
    "gateway/protocols/openai.py",
    "gateway/protocols/openai_errors.py",
    "gateway/protocols/reasoning.py",
    "gateway/protocols/rename.py",
    "gateway/protocols/response_store.py",
    "gateway/protocols/responses.py",
    "gateway/protocols/responses_stream.py",
    "gateway/protocols/responses_tools.py",
    "gateway/protocols/responses_translate.py",
    "gateway/protocols/sse.py",
    "gateway/protocols/tokenize.py",
    "gateway/upstream/connection.py",
    "gateway/fleet/kvevents/decode.py",
    "gateway/fleet/kvevents/index.py",
    "gateway/fleet/kvevents/subscriber.py",
]


def _ext_modules() -> list[object]:
    if os.environ.get("GATEWAY_COMPILE") != "1":
        return []
    args = sys.argv[1:]
    if {"develop", "editable_wheel"} & set(args) or "--inplace" in args or "-i" in args:
        sys.exit("GATEWAY_COMPILE=1 builds a wheel (`pip install .`), never in place: see setup.py")
    if not {"build", "build_ext", "bdist_wheel"} & set(args):
        return []  # metadata steps (egg_info, dist_info): nothing to compile yet
    from mypyc.build import mypycify

    return list(mypycify(COMPILED, opt_level="3"))


setup(ext_modules=_ext_modules())
