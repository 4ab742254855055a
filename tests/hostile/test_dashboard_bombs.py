"""A bomb uploaded to the dashboard ends its reading process, not the server:
one Chromium session uploads it in the Inspector while a second session
loads pages, and the server's own memory stays where it was.

The bomb: the pickle-memo billion laughs (9 KB, before: 9 GB after 277 s in
one process) with its item budget switched off in the server's environment,
so that only the net of ``loaders/sandbox.py`` is left (512 MiB of memory,
6 s). Then a stored checkpoint whose folder was replaced by a 3.2 GB
sparse GPT-2 (its sparse check off) is opened by a link: the Inspector's tie
check, spectra and attention maps read it in the child (``app.inspect_child``;
before: in the server, a layer read whole), each failing with one line, while
the other session loads pages.
"""
from __future__ import annotations

import shutil
import time

import pytest
import torch

from app.jobs import analyze
from loaders.checkpoints import open_checkpoint
from loaders.ingest import ingest_checkpoint
from loaders.store import Store
from tests.hostile.test_sandbox import SPARSE_D, _sparse_gpt2
from tests.app.browser import dashboard, wait_idle
from tests.faults.data import gpt2_folder
from tests.faults.server import listeners, pid_of_socket, rss_bytes
from tests.hostile.test_bombs import _laughs, gpt2_state


#: Overview loads in the other session per bomb: one shows it is served while the bomb runs;
#: after it the server's memory is still sampled until the bomb has ended.
LOADS = 1


def _serve_other(b, url: str, server: int, busy) -> tuple[list[float], int]:
    """Load the Overview in session ``b`` ``LOADS`` times while ``busy()`` (at most 120 s): the
    seconds of each load (none may show an exception) and the server's peak RSS, sampled until
    ``busy()`` ends."""
    t0, loads, peak = time.monotonic(), [], rss_bytes(server)
    while busy() and time.monotonic() - t0 < 120:
        if len(loads) < LOADS:
            s = time.monotonic()
            b.goto(url)                     # the Overview is the main page, at /
            wait_idle(b, timeout=60_000, quiet_ms=500)
            assert b.locator("[data-testid='stException']").count() == 0
            loads.append(time.monotonic() - s)
        else:
            time.sleep(0.25)
        peak = max(peak, rss_bytes(server))
    return loads, peak


@pytest.mark.slow
@pytest.mark.browser
def test_an_uploaded_bomb_ends_its_reader_and_other_sessions_are_served(tmp_path, monkeypatch):
    from playwright.sync_api import sync_playwright

    from tests.app.browser import CHROMIUM, CHROMIUM_ARGS

    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (bash scripts/setup.sh --dev installs it)")
    bomb = tmp_path / "laughs.pt"
    torch.save({"model": gpt2_state(), "laughs": _laughs()}, bomb)
    for name, value in {"QKVSCOPE_SIDE_ITEMS": str(10**15), "QKVSCOPE_SIDE_BYTES": str(10**15),
                        "QKVSCOPE_PARSE_MEMORY_MB": "512", "QKVSCOPE_PARSE_TIMEOUT_S": "6"}.items():
        monkeypatch.setenv(name, value)
    db = tmp_path / "db.duckdb"
    store = Store(db)
    store.migrate()
    folder = gpt2_folder(tmp_path / "gpt2", seed=0)                         # attention weights: no transformers
    cid = ingest_checkpoint(store, folder).checkpoint_id
    analyze(store, cid, opener=lambda p: open_checkpoint(p))                # stored, in this process
    shutil.rmtree(folder)
    sparse = _sparse_gpt2(folder, d=SPARSE_D, n_head=64)                    # same path: 1 layer of d 8,192
    monkeypatch.setenv("QKVSCOPE_ALLOW_SPARSE", "1")
    with dashboard(db, "--no-demo") as url, sync_playwright() as p:
        [(_, inode)] = listeners(int(url.rsplit(":", 1)[1]))
        server = pid_of_socket(inode)
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            # two tabs of one context, a Streamlit session each, asking for reduced motion (a user's
            # setting): no spinner repaints while a bomb runs
            context = browser.new_context(reduced_motion="reduce")
            a, b = context.new_page(), context.new_page()
            for pg in (a, b):                            # warm: the pages' imports are done once
                pg.goto(f"{url}/inspector?src=upload")
                wait_idle(pg, timeout=120_000)
            before = rss_bytes(server)
            a.locator("input[type=file]").set_input_files(str(bomb))
            a.wait_for_selector("text=Reading laughs.pt", timeout=60_000)
            loads, peak = _serve_other(b, url, server, lambda: a.locator("text=Reading laughs.pt").count())
            wait_idle(a, timeout=60_000)
            shown = a.inner_text("[data-testid='stMain']")
            a.goto(f"{url}/inspector?ckpt={cid}&layer=0&head=0")               # a link to the stored bomb
            later, peak2 = _serve_other(b, url, server,
                                        lambda: a.locator("[data-testid='stAlertContentError']").count() < 2)
            peak = max(peak, peak2)
            wait_idle(a, timeout=60_000)
            opened = a.inner_text("[data-testid='stMain']")
        finally:
            browser.close()
    print(f"server RSS {before / 2**20:.0f} -> peak {peak / 2**20:.0f} MiB; "
          f"{len(loads)} Overview loads in the other session while the bomb ran, "
          f"{min(loads):.1f}-{max(loads):.1f} s each")
    assert "laughs.pt" in shown
    assert ("reading it took more than 6 s" in shown or "needed more than 0.5 GiB" in shown), shown[:2000]
    assert "Traceback" not in shown
    assert loads, "the bomb ended before the other session loaded a page"
    print(f"stored bomb: {len(later)} Overview loads meanwhile; peak server RSS {peak / 2**20:.0f} MiB")
    # spectra (the tie check shows the ties stored with the analysis: it reads nothing), then the maps
    assert opened.count("more memory than this process may use") >= 1, opened[:3000]
    assert "needed more than 0.5 GiB" in opened, opened[:3000]
    assert str(sparse.parent.name) in opened and "Traceback" not in opened
    assert peak - before < 512 << 20                     # the bombs grew in their own processes
