"""``bench/analysis_speed.py``: one tiny run at the 1.1B geometry (one layer), whose ``BENCH_ROW``
lines ``bench/run_all.py`` reads, and the arithmetic its context rows report (no timing is asserted)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _x(figure: str) -> float:
    """``"12.03x (2.29 s)"`` -> 12.03."""
    return float(re.match(r"([\d.]+)x \(", figure).group(1))


@pytest.mark.slow
def test_a_one_layer_run_prints_the_targets_and_the_exact_arithmetic_beside_them(tmp_path):
    proc = subprocess.run([sys.executable, "bench/analysis_speed.py", "--shape", "1.1B", "--layers", "1",
                           "--skip-naive", "--repeat", "1", "--dir", str(tmp_path / "ckpt")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line[len("BENCH_ROW "):]) for line in proc.stdout.splitlines()
            if line.startswith("BENCH_ROW ")]
    assert [r["measured"].split(",")[0] for r in rows] == [
        "weight analysis", "weight analysis without the stacked-W_Q metrics",
        "the arithmetic no exact analysis skips", "weight analysis against that arithmetic",
        "peak RSS above imports"]
    assert [r["target"] for r in rows] == ["<= 2x", "<= 3x", "-", "-", "- (the 7B shape's)"]
    whole, _, exact, against, _ = rows
    # read + LU + M + per-head products holds the floor (read + LU) and more
    assert _x(exact["figure"]) > 1.0
    # analysis / floor = (analysis / exact) * (exact / floor), up to the printed rounding
    assert _x(whole["figure"]) == pytest.approx(_x(against["figure"]) * _x(exact["figure"]), rel=0.02)


def test_a_failing_phase_exits_with_its_traceback_not_a_bare_called_process_error(monkeypatch):
    # a phase runs in a fresh process with its output captured: its traceback is what says why
    # (found on a GPU machine, where the bench stopped at "returned non-zero exit status 1")
    monkeypatch.syspath_prepend(str(ROOT / "bench"))                  # as the script itself runs
    from analysis_speed import child_json

    code = "import sys; sys.stderr.write('Traceback (most recent call last):\\nValueError: boom\\n'); sys.exit(1)"
    with pytest.raises(SystemExit) as err:
        child_json([sys.executable, "-c", code])
    assert str(err.value).startswith("error: ") and "exited 1:\n" in str(err.value)
    assert str(err.value).endswith("ValueError: boom\n")
    assert child_json([sys.executable, "-c", "print('noise'); print('{\"seconds\": 1.5}')"]) == {"seconds": 1.5}


def test_a_parent_outlives_sigabrt_to_print_its_childs_stacks(tmp_path):
    # scripts/gpu_check.sh stops a step past its limit with SIGABRT to the process group; a child's
    # stacks (faulthandler) reach the screen only if the parent holding its stderr lives on
    script = tmp_path / "parent.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT / 'bench')!r})\n"
        "import _child\n"
        "_child.outlive_abort()\n"
        "print('started', flush=True)\n"
        "_child.run([sys.executable, '-c', 'import time\\ndef waiting():\\n    time.sleep(60)\\nwaiting()'])\n")
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)
    assert proc.stdout.readline() == "started\n"
    time.sleep(1.0)                                                   # the child is in its sleep
    os.killpg(proc.pid, signal.SIGABRT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1                                       # SystemExit with a message, not -6
    assert "SIGABRT: waiting for the child" in err
    assert "exited -6:" in err and "Fatal Python error: Aborted" in err
    assert 'line 3 in waiting' in err                                 # the child's own stack


def test_a_long_stderr_keeps_its_start_and_its_end(monkeypatch):
    # a faulthandler dump prints the innermost frame first, a traceback the error last
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import _child

    code = "import sys; sys.stderr.write('innermost\\n' + 'x' * 20000 + '\\nValueError: boom\\n'); sys.exit(2)"
    with pytest.raises(SystemExit) as err:
        _child.run([sys.executable, "-c", code])
    msg = str(err.value)
    assert "exited 2:\ninnermost\n" in msg and msg.endswith("ValueError: boom\n")
    assert "[... 14,028 characters ...]" in msg                     # 10 + 20,000 + 18 - 6,000
