"""Sample text for forward passes: the bundled corpus, files, folders, and every refusal."""
from __future__ import annotations

import hashlib
import os
import re
import signal
from collections import Counter
from pathlib import Path

import pytest

from loaders import text_corpus
from loaders.errors import FileError, QkvscopeError
from loaders.text_corpus import (TextSample, TextSampleError, bundled_corpus_path,
                                 read_text_sample)

HINT = "--text takes plain UTF-8 text or a folder of .txt files"


@pytest.fixture
def no_hang():
    """Fail instead of blocking forever if something opens a FIFO for reading."""
    def boom(*_):
        raise AssertionError("read_text_sample blocked (opened a FIFO?)")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(5)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.write_bytes(data)
    return path


def _message(path, problem: str) -> str:
    return f"{path}: {problem}"


# -- the bundled corpus ----------------------------------------------------------------------

def test_bundled_corpus_reads_and_is_prose():
    sample = read_text_sample()
    assert isinstance(sample, TextSample)
    assert sample.sources == ["data/corpus/austen-persuasion.txt"]
    assert sample.n_bytes == len(sample.text.encode("utf-8")) >= 200_000
    text = sample.text
    # Prose, not code or a word list: letters, spaces and line breaks make up nearly all of it,
    # punctuation is sentence punctuation, and sentences have a natural length.
    assert sum(c.isalpha() or c in " \n" for c in text) / len(text) > 0.95
    assert not re.search(r"[{}<>\[\]=#|\\]", text)
    words = re.findall(r"[A-Za-z']+", text)
    sentences = re.findall(r"[.!?][\"')]?\s", text)
    assert len(sentences) > 2_000
    assert 10 < len(words) / len(sentences) < 40
    top = [w for w, _ in Counter(w.lower() for w in words).most_common(10)]
    assert {"the", "and", "of", "to", "a"} <= set(top)
    assert len(set(w.lower() for w in words)) > 5_000  # a vocabulary, not a repeated phrase
    assert not re.search(r"Gutenberg|https?://|www\.|\*\*\* ?(START|END)", text)  # no boilerplate
    assert text.startswith("Persuasion\n") and text.endswith("\nFinis")  # whole, untrimmed


def test_bundled_corpus_is_listed_in_sources_md_with_its_checksum():
    root = bundled_corpus_path()
    assert root.is_dir() and root.name == "corpus" and root.parent.name == "data"
    sources_md = (root / "SOURCES.md").read_text(encoding="utf-8")
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() == ".txt")
    assert files, "the bundled corpus has no .txt files"
    total = 0
    for f in files:
        data = f.read_bytes()
        total += len(data)
        assert f"`{f.name}` | {len(data):,} |" in sources_md, f"{f.name} is not in SOURCES.md"
        assert hashlib.sha256(data).hexdigest() in sources_md, f"{f.name}: checksum differs"
        assert b"\r" not in data and not data.startswith(b"\xef\xbb\xbf")
        data.decode("utf-8")
    assert 200_000 <= total <= 600_000
    assert "public domain" in sources_md and "MIT" in sources_md


def test_bundled_corpus_is_the_default_and_respects_max_bytes():
    size = sum(p.stat().st_size for p in bundled_corpus_path().rglob("*.txt"))
    with pytest.raises(TextSampleError) as err:
        read_text_sample(None, max_bytes=size - 1)
    assert str(err.value) == _message(
        "data/corpus", f"{size:,} bytes in 1 .txt files, over the limit of {size - 1:,} bytes "
                       "for sample text; pass a folder with fewer .txt files, or cut it to the "
                       "part you need")
    assert read_text_sample(None, max_bytes=size).text == read_text_sample().text


# -- one file --------------------------------------------------------------------------------

def test_a_file_is_read_with_bom_dropped_and_line_breaks_normalised(tmp_path):
    f = _write(tmp_path / "notes.md", b"\xef\xbb\xbfOne line.\r\nTwo \xc3\xa9t\xc3\xa9.\rThree.\n\n")
    sample = read_text_sample(f)
    assert sample.text == "One line.\nTwo \u00e9t\u00e9.\nThree."
    assert sample.sources == [str(f)]
    assert sample.n_bytes == len("One line.\nTwo \u00e9t\u00e9.\nThree.".encode("utf-8")) == 27  # é is 2 bytes


def test_a_symlink_to_a_file_is_followed(tmp_path):
    f = _write(tmp_path / "real.txt", "Followed.\n")
    link = tmp_path / "link.txt"
    link.symlink_to(f)
    assert read_text_sample(link).text == "Followed."


def test_a_file_exactly_at_the_limit_is_read(tmp_path):
    f = _write(tmp_path / "t.txt", "0123456789")
    assert read_text_sample(f, max_bytes=10).text == "0123456789"


# -- folders ---------------------------------------------------------------------------------

def test_a_folder_reads_its_txt_files_recursively_in_sorted_order(tmp_path):
    root = tmp_path / "notes"
    _write(root / "b.txt", "Bee.\n")
    _write(root / "a.txt", "Ay, no final newline.")
    _write(root / "b" / "c.txt", "Sea.\r\n\r\n")
    _write(root / "b" / "deep" / "d.TXT", "Dee.\n")
    _write(root / "readme.md", "not read")
    _write(root / "data.csv", "x,y\n1,2\n")
    _write(root / ".hidden.txt", "not read")
    _write(root / ".git" / "x.txt", "not read")
    _write(root / "empty.txt", " \n\t\n")
    sample = read_text_sample(root)
    # "b.txt" sorts before "b/c.txt": "." (0x2e) < "/" (0x2f), as in the relative paths' order.
    assert sample.sources == [f"{root}/a.txt", f"{root}/b.txt", f"{root}/b/c.txt",
                              f"{root}/b/deep/d.TXT"]
    assert sample.text == "Ay, no final newline.\n\nBee.\n\nSea.\n\nDee."
    assert sample.n_bytes == len(sample.text)


def test_a_folder_given_with_a_trailing_slash_names_its_files_once(tmp_path):
    root = tmp_path / "t"
    _write(root / "x.txt", "Ex.")
    assert read_text_sample(f"{root}/").sources == [f"{root}/x.txt"]


def test_symlinks_inside_the_folder_are_read_once_and_links_leaving_it_are_skipped(tmp_path):
    root = tmp_path / "corpus"
    outside = _write(tmp_path / "outside.txt", "Outside: never read.")
    _write(root / "a.txt", "Inside.")
    (root / "b_out.txt").symlink_to(outside)
    (root / "c_same.txt").symlink_to(root / "a.txt")  # the same file under a second name
    (root / "d_dangling.txt").symlink_to(root / "missing.txt")
    (root / "sub_out").symlink_to(tmp_path, target_is_directory=True)  # a folder outside
    sample = read_text_sample(root)
    assert sample.sources == [f"{root}/a.txt"]
    assert sample.text == "Inside."


def test_a_folder_whose_only_txt_file_leaves_it_is_refused(tmp_path):
    root = tmp_path / "corpus"
    root.mkdir()
    (root / "link.txt").symlink_to(_write(tmp_path / "outside.txt", "Outside."))
    with pytest.raises(TextSampleError) as err:
        read_text_sample(root)
    assert str(err.value) == _message(
        root, "no .txt files in this folder or its subfolders (hidden files, FIFOs, device "
              f"files and symlinks leaving the folder are skipped); {HINT}")


def test_a_fifo_in_a_folder_is_skipped_without_opening_it(tmp_path, no_hang):
    root = tmp_path / "corpus"
    _write(root / "a.txt", "Text.")
    os.mkfifo(root / "pipe.txt")
    assert read_text_sample(root).sources == [f"{root}/a.txt"]


def test_a_fifo_is_refused_without_opening_it(tmp_path, no_hang):
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)
    with pytest.raises(TextSampleError) as err:
        read_text_sample(fifo)
    assert str(err.value) == _message(fifo, f"not a regular file (a FIFO); {HINT}")


def test_a_device_file_is_refused():
    with pytest.raises(TextSampleError) as err:
        read_text_sample("/dev/null")
    assert str(err.value) == f"/dev/null: not a regular file (a character device); {HINT}"


def test_a_file_swapped_for_a_fifo_after_the_check_is_refused_on_the_open_descriptor(
        tmp_path, no_hang):
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)
    with pytest.raises(TextSampleError) as err:
        text_corpus._read_file(fifo, "pipe.txt", budget=100)
    assert str(err.value) == f"pipe.txt: not a regular file (a FIFO); {HINT}"


# -- refusals --------------------------------------------------------------------------------

def test_a_missing_path_is_refused(tmp_path):
    missing = tmp_path / "nothing-here"
    with pytest.raises(TextSampleError) as err:
        read_text_sample(missing)
    assert str(err.value) == _message(missing, f"no such file or folder; {HINT}")
    assert isinstance(err.value, FileError) and isinstance(err.value, QkvscopeError)
    assert err.value.path == str(missing)


@pytest.mark.parametrize("data, problem", [
    (b"0123456789\xff rest", "invalid UTF-8 at byte 10"),
    (b"\xef\xbb\xbfab\xc3", "invalid UTF-8 at byte 5"),         # offset counts the BOM
    (b"%PDF-1.7\n\xe2\x28\xa1", "invalid UTF-8 at byte 9"),      # a bad continuation byte
    (b"ab\x00cd", "a NUL byte at byte 2"),                        # valid UTF-8, still binary
    ("Hi".encode("utf-16"), "invalid UTF-8 at byte 0"),          # BOM ff fe
    (b"abc\x00\xff", "a NUL byte at byte 3"),                     # the first problem is named
    (b"abc\xff\x00", "invalid UTF-8 at byte 3"),
])
def test_a_file_that_is_not_utf8_text_is_refused_with_the_byte_offset(tmp_path, data, problem):
    f = _write(tmp_path / "notes.pdf", data)
    with pytest.raises(TextSampleError) as err:
        read_text_sample(f)
    assert str(err.value) == _message(f, f"not a text file ({problem}); {HINT}")


def test_a_bad_file_in_a_folder_is_named_by_its_path(tmp_path):
    root = tmp_path / "corpus"
    _write(root / "a.txt", "Fine.")
    _write(root / "sub" / "bad.txt", b"caf\xe9")
    with pytest.raises(TextSampleError) as err:
        read_text_sample(root)
    assert str(err.value) == f"{root}/sub/bad.txt: not a text file (invalid UTF-8 at byte 3); {HINT}"


@pytest.mark.parametrize("data", [b"", b"   \n\t\r\n", b"\xef\xbb\xbf\n"])
def test_an_empty_file_is_refused(tmp_path, data):
    f = _write(tmp_path / "empty.txt", data)
    with pytest.raises(TextSampleError) as err:
        read_text_sample(f)
    assert str(err.value) == _message(f, f"no text in it (empty or only whitespace); {HINT}")


def test_a_folder_of_empty_txt_files_is_refused(tmp_path):
    root = tmp_path / "corpus"
    _write(root / "a.txt", "")
    _write(root / "b" / "c.txt", "\n\n")
    with pytest.raises(TextSampleError) as err:
        read_text_sample(root)
    assert str(err.value) == _message(
        root, f"no text in its 2 .txt file(s) (all empty or only whitespace); {HINT}")


def test_a_folder_without_txt_files_is_refused(tmp_path):
    root = tmp_path / "pdfs"
    _write(root / "paper.pdf", b"%PDF")
    with pytest.raises(TextSampleError) as err:
        read_text_sample(root)
    assert str(err.value) == _message(
        root, "no .txt files in this folder or its subfolders (hidden files, FIFOs, device "
              f"files and symlinks leaving the folder are skipped); {HINT}")


def test_a_file_over_the_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    f = _write(tmp_path / "big.txt", "x" * 11)

    def no_open(*_a, **_k):
        raise AssertionError("opened a file over the limit")
    monkeypatch.setattr(text_corpus.os, "open", no_open)
    with pytest.raises(TextSampleError) as err:
        read_text_sample(f, max_bytes=10)
    assert str(err.value) == _message(
        f, "11 bytes, over the limit of 10 bytes for sample text; pass a smaller file, or cut "
           "it to the part you need")


def test_a_folder_over_the_limit_is_refused_before_any_file_is_read(tmp_path, monkeypatch):
    root = tmp_path / "corpus"
    _write(root / "a.txt", "x" * 600)
    _write(root / "b" / "c.txt", "y" * 500)

    def no_open(*_a, **_k):
        raise AssertionError("opened a file of a folder over the limit")
    monkeypatch.setattr(text_corpus.os, "open", no_open)
    with pytest.raises(TextSampleError) as err:
        read_text_sample(root, max_bytes=1_000)
    assert str(err.value) == _message(
        root, "1,100 bytes in 2 .txt files, over the limit of 1,000 bytes for sample text; pass "
              "a folder with fewer .txt files, or cut it to the part you need")


def test_a_file_that_grows_while_being_read_stops_at_the_limit(tmp_path, monkeypatch):
    f = _write(tmp_path / "log.txt", "z" * 50)
    real_stat = os.stat

    def stale_stat(p, *a, **k):  # the size seen before the read: 5 bytes
        st = real_stat(p, *a, **k)
        if Path(p) == f:
            return os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink, st.st_uid,
                                   st.st_gid, 5, st.st_atime, st.st_mtime, st.st_ctime))
        return st
    monkeypatch.setattr(text_corpus.os, "stat", stale_stat)
    with pytest.raises(TextSampleError) as err:
        read_text_sample(f, max_bytes=20)
    assert str(err.value) == _message(
        f, f"grew past the limit of 20 bytes left for it while being read; {HINT}")


def test_max_bytes_must_be_positive():
    with pytest.raises(ValueError, match="max_bytes must be at least 1, got 0"):
        read_text_sample(max_bytes=0)
