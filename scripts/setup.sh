#!/usr/bin/env bash
# Create .venv (if missing) and install what qkvscope needs.
#   bash scripts/setup.sh          runtime only (the dashboard and the CLI)
#   bash scripts/setup.sh --dev    plus the test tools and Debian's chromium for browser tests
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
fi
req=requirements.txt
[ "${1:-}" = "--dev" ] && req=requirements-dev.txt
.venv/bin/python -m pip install -q -r "$req"
if [ "${1:-}" = "--dev" ] && [ ! -x /usr/bin/chromium ]; then
  # Browser tests drive Debian's Chromium (never a downloaded browser).
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null
fi
