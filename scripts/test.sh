#!/usr/bin/env bash
# Install what is needed and run every test that can run without a GPU
# (unit, slow and browser tiers; the gpu tier is skipped where CUDA is absent).
# Extra arguments go to pytest (e.g. -m "not slow and not browser" for a quick run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --dev
exec .venv/bin/python -m pytest "$@"
