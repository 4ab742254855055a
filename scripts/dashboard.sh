#!/usr/bin/env bash
# Install what is needed and open the dashboard on the bundled demo experiments.
# Extra arguments go to `python -m app serve` (e.g. --port 8600, --db my.duckdb).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m app serve "$@"
