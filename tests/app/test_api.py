"""``app.api``, the notebook API, on the bundled demo: each function gives what its command prints."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from app import api
from app.cli import main
from app.paths import DEMO_DIR
from tests.demo_db import demo_db

KV = DEMO_DIR / "k_eq_v-mha-wd0.1" / "checkpoints" / "final_step_004000.safetensors"


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return demo_db(tmp_path_factory, tmp_path_factory.mktemp("api") / "demo.duckdb")


def _cli_json(capsys, *argv: str):
    capsys.readouterr()
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_info_is_the_commands_json(capsys):
    got = api.info(KV)
    assert got["variant"] == "k_eq_v" and got["tied"]["variant"] == "k_eq_v"
    assert got == _cli_json(capsys, "info", str(KV), "--json")


def test_analyze_gives_the_rows_of_analyze_json_with_their_chance(db, capsys):
    df = api.analyze(KV, db=db)
    assert list(df.columns) == ["layer", "head", "metric", "value", "chance", "n_tokens", "ci_low", "ci_high"]
    cosine = df[df["metric"] == "kv_cosine_flat"]
    assert len(cosine) > 0 and cosine["value"].tolist() == pytest.approx([1.0] * len(cosine))   # K = V
    assert cosine["chance"].notna().all()
    assert df.attrs["checkpoint"]["path"] == str(KV)
    cli = _cli_json(capsys, "analyze", str(KV), "--db", str(db), "--json")
    assert cli["cached"] and df.attrs["checkpoint"]["id"] == cli["checkpoint"]["id"]
    def rows(frame):                               # stored results read back come in another order
        frame = frame.astype({"head": float, "n_tokens": float, "ci_low": float, "ci_high": float})
        return frame.sort_values(["layer", "metric", "head"], na_position="first").reset_index(drop=True)

    expected = pd.DataFrame(cli["metrics"]).reindex(columns=df.columns)
    pd.testing.assert_frame_equal(rows(df), rows(expected), check_dtype=False)


def test_kv_cost_is_the_commands_json(capsys):
    got = api.kv_cost("llama-3-8b", variant="k_eq_v", gpu="h100-sxm")
    assert got["savings"]["saving_bytes_per_token"] == pytest.approx(0.5)      # K = V caches one of two
    assert got == _cli_json(capsys, "kv-cost", "--preset", "llama-3-8b", "--variant", "k_eq_v", "--json")


def test_an_option_the_command_lacks_is_refused():
    with pytest.raises(TypeError, match=r"kv-cost: no option 'kv_head'"):
        api.kv_cost("llama-3-8b", kv_head=1)


def test_runs_points_and_results_read_the_demo(db, capsys):
    runs = api.runs(db)
    listed = _cli_json(capsys, "runs", "--db", str(db), "--json", "--config")
    assert runs["id"].tolist() == [r["id"] for r in listed] and len(runs) == len(list(DEMO_DIR.glob("*/config.json")))
    name = "qkv-mha-wd0.1"
    run_id = int(runs.loc[runs["name"] == name, "id"].iloc[0])
    logged = [json.loads(line) for line in (DEMO_DIR / name / "metrics.jsonl").read_text().splitlines()]
    val = [(r["step"], r["val_loss"]) for r in logged if "val_loss" in r]
    pts = api.points(db, "val/loss", runs=[run_id])                # val_loss as ingest names it
    assert pts["step"].tolist() == [s for s, _ in val] and pts["value"].tolist() == pytest.approx([v for _, v in val])

    table = api.results(db, ["val/loss"], weight_decay=0.1)
    row = table[(table["variant"] == "qkv") & (table["sharing"] == "MHA") & (table["task"] == "language")].iloc[0]
    seeds = [f"qkv-mha-wd0.1{s}" for s in ("", "-seed1", "-seed2")]
    finals = [[json.loads(x)["val_loss"] for x in (DEMO_DIR / s / "metrics.jsonl").read_text().splitlines()
               if "val_loss" in x][-1] for s in seeds]
    assert row["n runs"] == 3 and row["val/loss mean"] == pytest.approx(sum(finals) / 3)
