"""The bundled demo's README tables (``experiments.demo.table_markdown``), known answers."""
from __future__ import annotations

from experiments.demo import LANGUAGE_COLUMNS, VISION_COLUMNS, table_markdown

ROWS = [dict(name="a", variant="qkv", n_head=4, n_kv_heads=2, weight_decay=0.03, seed=1337,
             final_val_loss=1.23456, best_val_loss=1.1, final_val_accuracy=0.91234, best_val_accuracy=0.95,
             params=12345, params_attention=999, kv_bytes_per_token=2048),
        dict(name="b", variant="k_eq_v", n_head=4, n_kv_heads=1, weight_decay=0.0, seed=1,
             final_val_loss=2.0, best_val_loss=1.5, final_val_accuracy=0.5, best_val_accuracy=0.6)]


def test_language_table():
    assert table_markdown(ROWS) == table_markdown(ROWS, LANGUAGE_COLUMNS) == "\n".join([
        "| run | variant | heads (kv) | weight decay | seed | final val loss | best val loss | params "
        "| attention params | KV bytes/token (fp32) |",
        "|---|---|---|---|---|---|---|---|---|---|",
        "| `a` | `qkv` | 4 (2, GQA2) | 0.03 | 1337 | 1.2346 | 1.1000 | 12,345 | 999 | 2,048 |",
        "| `b` | `k_eq_v` | 4 (1, MQA) | 0 | 1 | 2.0000 | 1.5000 | 0 | 0 | 0 |"])


def test_vision_table():
    assert table_markdown(ROWS, VISION_COLUMNS) == "\n".join([
        "| run | variant | heads (kv) | weight decay | final val accuracy | best val accuracy "
        "| final val loss | params | attention params | KV bytes/token (fp32) |",
        "|---|---|---|---|---|---|---|---|---|---|",
        "| `a` | `qkv` | 4 (2, GQA2) | 0.03 | 0.912 | 0.950 | 1.2346 | 12,345 | 999 | 2,048 |",
        "| `b` | `k_eq_v` | 4 (1, MQA) | 0 | 0.500 | 0.600 | 2.0000 | 0 | 0 | 0 |"])
