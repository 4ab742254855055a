#!/usr/bin/env bash
# Install what is needed and run every test that can run without a GPU
# (unit, slow and browser tiers; the gpu tier is skipped where CUDA is absent).
# Extra arguments go to pytest (e.g. -m "not slow and not browser" for a quick run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --dev
# Two workers (QKVSCOPE_TEST_WORKERS), each taking whole test files: about 1.6x faster on two
# cores than one process; QKVSCOPE_TEST_WORKERS=0 runs everything in this process.
exec .venv/bin/python -m pytest -n "${QKVSCOPE_TEST_WORKERS:-2}" --dist loadfile "$@"
