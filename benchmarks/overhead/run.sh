#!/usr/bin/env bash
# Gateway overhead benchmark. Needs nginx and wrk (apt-get install -y nginx wrk), taskset, and the
# gateway installed (pip install -e .). Method and figures: docs/benchmarks.md.
#   run.sh [peers.py options]     the gateway beside its peers, interleaved rounds (peers.py --help)
#   run.sh --smoke                20 s, gateway vs the floor; exit 1 only past 2x the floor
#   run.sh --compare REV_A REV_B  two commits of the gateway interleaved (git worktrees in a temp dir)
#   run.sh --direct [options]     the older table: direct to the upstream vs via the gateway (bench.py)
#   run.sh --protocols [options]  chat beside Anthropic Messages, native and translated (protocols.py)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/../.."
if [ "${1:-}" = "--direct" ]; then
    shift
    exec "${PYTHON:-python3}" "$here/bench.py" "$@"
fi
if [ "${1:-}" = "--protocols" ]; then
    shift
    exec "${PYTHON:-python3}" "$here/protocols.py" "$@"
fi
exec "${PYTHON:-python3}" "$here/peers.py" "$@"
