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
# The same lists as pyproject.toml's dependencies and its `dev` extra (it reads these files).
reqs=(-r requirements.txt)
[ "${1:-}" = "--dev" ] && reqs+=(-r requirements-scale.txt -r requirements-dev.txt)
# pip byte-compiles what it installs one file at a time (torch alone is thousands of files);
# compileall does the same files on every core, skipping those already compiled.
.venv/bin/python -m pip install -q --no-compile "${reqs[@]}"
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "byte-compiling the installed packages (every core; up to a minute the first time)" >&2
# A few packages ship files that are not Python (templates, Python 2 examples): pip skips them
# quietly too, so their failures are not ours to stop on.
.venv/bin/python -m compileall -q -j 0 "$site" >/dev/null 2>&1 || true
# Byte-compile the project's own modules: where the environment sets PYTHONDONTWRITEBYTECODE (this
# machine's does), no process writes them, so every process that starts compiled all it imports
# again (0.6 s of each CLI, child, server or test process's imports).
.venv/bin/python -m compileall -q -j 0 app analysis loaders experiments tests bench >/dev/null
if [ "${1:-}" = "--dev" ] && [ ! -x /usr/bin/chromium ]; then
  # Browser tests drive Debian's Chromium (never a downloaded browser).
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null
fi
