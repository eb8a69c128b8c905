#!/usr/bin/env bash
# Install the real coding agents the agent tests run, at the versions pinned in
# tests/agents/package.json, into the CI cache, once:
#   ${GATEWAY_CI_CACHE:-~/.cache/gateway-ci}/agents-<claude-code version>-<codex version>/node_modules/.bin
# Prints that bin directory. Needs node and npm (the npm registry); does nothing when already there.
# To try the newest releases instead: GATEWAY_AGENTS=latest bash tests/agents/setup.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if [ "${GATEWAY_AGENTS:-pinned}" = latest ]; then
    claude="$(npm view @anthropic-ai/claude-code version)"
    codex="$(npm view @openai/codex version)"
else
    claude="$(node -p "require('$here/package.json').dependencies['@anthropic-ai/claude-code']")"
    codex="$(node -p "require('$here/package.json').dependencies['@openai/codex']")"
fi
dir="${GATEWAY_CI_CACHE:-$HOME/.cache/gateway-ci}/agents-$claude-$codex"
if [ ! -x "$dir/node_modules/.bin/claude" ] || [ ! -x "$dir/node_modules/.bin/codex" ]; then
    mkdir -p "$dir"
    npm install --prefix "$dir" --no-audit --no-fund --silent \
        "@anthropic-ai/claude-code@$claude" "@openai/codex@$codex" >&2
fi
echo "$dir/node_modules/.bin"
