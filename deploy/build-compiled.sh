#!/usr/bin/env bash
# Build the gateway with its request path compiled by mypyc (setup.py, GATEWAY_COMPILE=1) into a
# folder keyed by a hash of the sources and the compiler, and print that folder's path:
#   PYTHONSAFEPATH=1 PYTHONPATH="$(bash deploy/build-compiled.sh)" python3 -m gateway.cli serve
# (PYTHONSAFEPATH: `python -m` would put the current folder first on sys.path, and in a checkout its
# Python modules would shadow the compiled ones.)
# Cached under ${GATEWAY_CI_CACHE:-~/.cache/gateway-ci}/compiled; about 100 s on two cores when
# the sources changed. Needs a C compiler; installs mypy, setuptools and wheel if they are missing.
# The source tree is copied first, so no compiled module ever lands beside the code you edit.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
if ! "$py" -c 'import mypyc.build, setuptools, wheel' 2>/dev/null; then
    "$py" -m pip install -q --disable-pip-version-check 'mypy>=1.10' setuptools wheel >&2
fi
key=$(
    {
        cat setup.py pyproject.toml
        find gateway engines -name '*.py' | LC_ALL=C sort | xargs cat
        "$py" -c 'import sys, mypy.version; print(mypy.version.__version__, sys.version)'
    } | sha256sum | cut -c1-16
)
out=${GATEWAY_CI_CACHE:-$HOME/.cache/gateway-ci}/compiled/$key
if [ ! -f "$out/.built" ]; then
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    cp -r setup.py pyproject.toml README.md gateway engines "$work/"
    find "$work" -name __pycache__ -prune -exec rm -rf {} +
    # The checkout's mypy `files` name paths (tests, benchmarks) that the build folder lacks, and a
    # missing path sends mypyc's type check astray; setup.py lists the modules to compile.
    sed -i '/^files = /d' "$work/pyproject.toml"
    (cd "$work" && GATEWAY_COMPILE=1 "$py" -m pip install -q --disable-pip-version-check \
        --no-build-isolation --no-deps --target "$work/out" .) >&2
    rm -rf "$out"
    mkdir -p "$(dirname "$out")"
    mv "$work/out" "$out"
    touch "$out/.built"
fi
echo "$out"
