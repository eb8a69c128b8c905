#!/usr/bin/env bash
# Install the official openai Node SDK pinned in tests/node/package.json into the CI cache, once:
#   ${GATEWAY_CI_CACHE:-~/.cache/gateway-ci}/node-openai-<version>/node_modules/openai
# Prints that directory. Needs node and npm (the npm registry); does nothing when already there.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
version="$(node -p "require('$here/package.json').dependencies.openai")"
dir="${GATEWAY_CI_CACHE:-$HOME/.cache/gateway-ci}/node-openai-$version"
if [ ! -f "$dir/node_modules/openai/package.json" ]; then
    mkdir -p "$dir"
    npm install --prefix "$dir" --no-audit --no-fund --silent "openai@$version" >&2
fi
echo "$dir"
