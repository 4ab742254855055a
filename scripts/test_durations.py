"""Per-file test seconds for tests/conftest.py's ordering, from a run's JUnit XML or a pytest log
with ``--durations=N``.

    bash scripts/test.sh --junitxml=/tmp/run.xml; .venv/bin/python scripts/test_durations.py /tmp/run.xml
    bash scripts/test.sh --durations=60 > /tmp/log.txt; .venv/bin/python scripts/test_durations.py /tmp/log.txt

writes tests/durations.json: each file's summed seconds (JUnit: every test's ``time``, setup and
teardown included; a log: setup/call/teardown among the slowest N), files of at least one second,
longest first (the files that decide when a run ends; the rest are ordered by their count of
slow tests).
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


def per_file_junit(xml: str) -> dict[str, int]:
    """The same from JUnit XML: ``<testcase classname="tests.app.test_x" time="1.5">`` (a class
    inside the file adds its name to ``classname``: the path is the longest prefix that is a file)."""
    import xml.etree.ElementTree as ET

    root = Path(__file__).resolve().parents[1]
    seconds: dict[str, float] = {}
    for case in ET.fromstring(xml).iter("testcase"):
        parts = case.get("classname", "").split(".")
        path = next((p for p in ("/".join(parts[:i]) + ".py" for i in range(len(parts), 0, -1))
                     if (root / p).is_file()), None)
        if path:
            seconds[path] = seconds.get(path, 0.0) + float(case.get("time") or 0)
    return {path: round(s) for path, s in sorted(seconds.items(), key=lambda kv: -kv[1]) if round(s) >= 1}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    text = Path(argv[0]).read_text()
    got = per_file_junit(text) if text.lstrip().startswith("<") else per_file(text)
    if not got:
        print(f"{argv[0]}: no test times (run pytest with --junitxml=FILE or --durations=60)", file=sys.stderr)
        return 2
    out = Path(__file__).resolve().parents[1] / "tests" / "durations.json"
    out.write_text(json.dumps(got, indent=1) + "\n")
    print(f"{out}: {len(got)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
