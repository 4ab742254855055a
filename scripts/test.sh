#!/usr/bin/env bash
# Install what is needed and run every test that can run without a GPU
# (unit, slow and browser tiers; the gpu tier is skipped where CUDA is absent).
# Extra arguments go to pytest (e.g. -m "not slow and not browser" for a quick run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --dev
# Three workers (QKVSCOPE_TEST_WORKERS), each taking whole test files, the longest files first
# (tests/conftest.py: tests/durations.json, then the count of slow tests; --no-loadscope-reorder keeps
# that order, which pytest-xdist would otherwise replace by the count of tests per file): the slow
# tests mostly wait on servers, browsers and child processes, so a third worker fills two cores;
# QKVSCOPE_TEST_WORKERS=0 runs everything in this process.
exec .venv/bin/python -m pytest -n "${QKVSCOPE_TEST_WORKERS:-3}" --dist loadfile --no-loadscope-reorder "$@"
