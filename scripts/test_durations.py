"""Per-file test seconds for tests/conftest.py's ordering, from a pytest log with ``--durations=N``.

    bash scripts/test.sh --durations=60 > /tmp/log.txt; .venv/bin/python scripts/test_durations.py /tmp/log.txt

writes tests/durations.json: each file's summed setup/call/teardown seconds among the slowest N
(the files that decide when a run ends; the rest are ordered by their count of slow tests).
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

LINE = re.compile(r"^(\d+(?:\.\d+)?)s (?:setup|call|teardown)\s+(tests/\S+?\.py)::")


def per_file(log: str) -> dict[str, int]:
    seconds: dict[str, float] = {}
    for line in log.splitlines():
        m = LINE.match(line)
        if m:
            seconds[m.group(2)] = seconds.get(m.group(2), 0.0) + float(m.group(1))
    return {path: round(s) for path, s in sorted(seconds.items(), key=lambda kv: -kv[1])}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    got = per_file(Path(argv[0]).read_text())
    if not got:
        print(f"{argv[0]}: no --durations lines (run pytest with --durations=60)", file=sys.stderr)
        return 2
    out = Path(__file__).resolve().parents[1] / "tests" / "durations.json"
    out.write_text(json.dumps(got, indent=1) + "\n")
    print(f"{out}: {len(got)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
