"""Every hostile file through both doors a user has: ``ingest`` (library and
CLI) and ``info``. Each must give a one-line error (or a skip) that names the
file, never run a payload, and leave the database as it was."""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import zipfile

import pytest

from app.cli import main
from loaders.ingest import ingest_paths
from loaders.store import Store
from tests.hostile.corpus import MARKER_NAME, build, errors_only

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
GOOD_LOG = "step,metric,value\n0,train_loss,4.0\n10,train_loss,3.5\n20,train_loss,3.1\n"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile") / "corpus"
    cases = build(root)
    yield root, {c.name: c for c in cases}
    assert not (root / MARKER_NAME).exists(), "a pickle payload ran"


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    """A database that already holds one good run (so 'unchanged' means something)."""
    d = tmp_path_factory.mktemp("seed")
    (d / "good").mkdir()
    (d / "good" / "metrics.csv").write_text(GOOD_LOG)
    db = d / "seed.duckdb"
    report = ingest_paths(Store(db), [d / "good"])
    assert [f.status for f in report.files] == ["added"]
    return db


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def dump(db) -> dict:
    """Every table's rows, sorted: the database's logical content."""
    with Store(db).connect(read_only=True) as con:
        tables = [r[0] for r in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' ORDER BY 1").fetchall()]
        return {t: sorted(map(repr, con.execute(f'SELECT * FROM "{t}"').fetchall())) for t in tables}


@pytest.fixture
def db(seeded, tmp_path):
    copy = tmp_path / "db.duckdb"
    shutil.copy(seeded, copy)
    return copy


CASES = ["pickle_pt_zip", "pickle_bin_legacy", "pickle_ckpt_raw", "pickle_in_zip_upload",
         "pickle_model_args_pkl", "pickle_in_hf_folder",
         "zip_dotdot", "zip_absolute", "zip_symlink", "zip_bomb_ratio", "zip_too_many_entries",
         "st_header_past_file", "st_overlap", "st_offsets_out_of_range", "st_unknown_dtype",
         "st_100mb_header", "st_shape_overflow",
         "log_binary_garbage", "log_50mb_single_line", "log_non_utf8"]


def test_the_corpus_is_what_the_tests_list(corpus):
    assert sorted(corpus[1]) == sorted(CASES)


@pytest.mark.parametrize("name", CASES)
def test_ingest_refuses_and_leaves_the_database_byte_identical(corpus, db, name):
    root, cases = corpus
    case = cases[name]
    before, content = digest(db), dump(db)
    report = ingest_paths(Store(db), [case.path])
    assert [(f.path, f.status, f.reason) for f in report.files] == [(str(case.path), case.status, case.reason)]
    assert digest(db) == before
    assert dump(db) == content
    assert not (root / MARKER_NAME).exists()


@pytest.mark.parametrize("name", CASES)
def test_cli_ingest_and_info_say_one_line_and_change_nothing(corpus, db, name, capsys):
    root, cases = corpus
    case = cases[name]
    before = digest(db)
    rc = main(["ingest", str(case.path), "--db", str(db), "--json"])
    out, err = capsys.readouterr()
    assert rc == (2 if case.status == "error" else 0)
    assert errors_only(err) == ""
    files = json.loads(out)["files"]
    assert [(f["status"], f["reason"]) for f in files] == [(case.status, case.reason)]
    assert main(["info", str(case.path)]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"error: {case.info}\n")
    assert digest(db) == before
    assert not (root / MARKER_NAME).exists()


def test_zip_total_size_limit_through_ingest(tmp_path, db, monkeypatch):
    """The 64 GiB total limit (lowered here: a real one needs a forged zip64 directory)."""
    monkeypatch.setattr("loaders.sources.zip_upload._ZIP_MAX_TOTAL", 3 << 20)
    zp = tmp_path / "big.zip"
    with zipfile.ZipFile(zp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for k in range(4):                          # 4 x 1 MiB, each under the per-entry ratio check
            zf.writestr(f"run/part{k}.bin", bytes(1 << 20))
    before = digest(db)
    [f] = ingest_paths(Store(db), [zp]).files
    assert (f.status, f.reason) == (
        "error", f"{zp}: zip expands to {4 << 20} bytes, over the {3 << 20}-byte limit")
    assert digest(db) == before
    assert not list(tmp_path.glob("run*"))


def test_whole_corpus_through_the_real_cli(corpus, db):
    """One ``python -m app ingest CORPUS`` over every hostile file at once, and
    ``python -m app info`` on a payload: exit codes, no traceback, nothing ran."""
    root, cases = corpus
    before = digest(db)
    proc = subprocess.run([sys.executable, "-m", "app", "ingest", str(root), "--db", str(db), "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert errors_only(proc.stderr) == ""
    report = json.loads(proc.stdout)
    got = {f["path"]: (f["status"], f["reason"]) for f in report["files"]}
    assert got == {str(c.path): (c.status, c.reason) for c in cases.values()}
    assert report["added"] == report["appended"] == 0
    assert digest(db) == before
    case = cases["pickle_pt_zip"]
    proc = subprocess.run([sys.executable, "-m", "app", "info", str(case.path), "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", f"error: {case.info}\n")
    assert not (root / MARKER_NAME).exists()
