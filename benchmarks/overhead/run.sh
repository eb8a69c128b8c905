#!/usr/bin/env bash
# Gateway overhead benchmark: direct-to-upstream vs through the gateway, in one run (~2.5 min).
# Needs: nginx and wrk (apt-get install -y nginx wrk), taskset, and the gateway installed
# (pip install -e .). Options: see `run.sh --help`. Method and figures: docs/benchmarks.md.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/../.."
exec "${PYTHON:-python3}" "$here/bench.py" "$@"
