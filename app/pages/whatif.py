"""What if: what would sharing cost this model? A checkpoint converted post hoc to each chosen
target (K=V and MQA by default), one layer at a time in the cheapest order (``python -m app whatif
--layers greedy``), drawn as one curve per target of KV bytes saved against perplexity change on
one chart (``app.page_figures.whatif_figure``), beside what training with the tie from scratch
gave: the stored runs chosen as reference points against their Q-K-V run (by default the demo's
K=V- and MQA-trained runs against its Q-K-V run), and the projection-sharing paper's trained
variants (``analysis.sharing_cost``). On "Run" each target is converted in a child process under
the analysis budgets (``loaders.sandbox``, job ``whatif``), all on the same tokens; the results are kept for
this browser session only, and a target already run with the same checkpoint, method and tokens
is not run again.
"""
from __future__ import annotations

import pandas as pd
import streamlit as st

from analysis.conversion_targets import METHODS
from analysis.sharing_cost import curve, paper_points, trained_points
from app import figures
from app.page_figures import whatif_figure, whatif_label
from app.paths import DEMO_DIR
from app.plain import md
from app.state import get_store
from loaders import curves
from loaders.run_table import run_table

TITLE = "What if"
ICON = ":material/call_split:"
ORDER = 45
URL_PATH = "what-if"

TARGETS = ("k_eq_v", "mqa", "gqa:2", "q_eq_k", "q_eq_k_eq_v", "wq_identity", "latent:16")
#: Targets converted by default: the ties the demo has runs trained with.
DEFAULT_TARGETS = ("k_eq_v", "mqa")
DEFAULT_CHECKPOINT = DEMO_DIR / "qkv-mha-wd0.1" / "checkpoints" / "final_step_004000.safetensors"
#: The demo's runs drawn by default: the Q-K-V run and the runs trained with the ties.
DEMO_BASELINE = "qkv-mha-wd0.1"
DEMO_TRAINED = ["k_eq_v-mha-wd0.1", "qkv-mqa-wd0.1", "k_eq_v-mqa-wd0.1"]
_RESULTS = "whatif_results"


def _reference_runs():
    """``name, final, kv_bytes_per_token`` of every stored run (final validation loss)."""
    store = get_store()
    runs = run_table(store, geometry=True)
    finals = curves.final_values(store, "val/loss")
    return runs.merge(finals.rename(columns={"run_id": "id"}), on="id", how="left")[
        ["name", "final", "kv_bytes_per_token"]]


def render() -> None:
    st.title("What if")
    st.caption("What would sharing cost this model? A trained checkpoint converted without training, "
               "layer by layer in the cheapest order; the perplexity change against the KV cache saved, beside "
               "what training with the tie from scratch gave. Methods and sources: docs/whatif.md.")
    c1, c2, c3 = st.columns([4, 3, 1])
    path = c1.text_input("Checkpoint", str(DEFAULT_CHECKPOINT))
    targets = c2.multiselect("Convert to", TARGETS, default=list(DEFAULT_TARGETS))
    tokens = c3.number_input("Tokens", min_value=64, max_value=65536, value=1024, step=256)
    cols = st.columns(max(len(targets), 1))
    methods = {t: col.selectbox(f"Method for {t}", METHODS[t.split(":")[0]], key=f"whatif_method_{t}")
               for t, col in zip(targets, cols)}
    keys = {t: (path, t, m, int(tokens)) for t, m in methods.items()}
    results = st.session_state.setdefault(_RESULTS, {})
    if st.button("Run", type="primary", disabled=not targets):
        from app.sandbox_jobs import call   # here: only when a conversion runs

        for t, key in keys.items():
            if key in results:                  # kept from an earlier Run in this session
                continue
            with st.spinner(f"converting to {t} layer by layer..."):
                # the pooled child: the targets of one Run, and later Runs, share one start of it
                results[key] = call("whatif", path, pooled=True, timeout="QKVSCOPE_ANALYSIS_TIMEOUT_S",
                                    to=t, method=methods[t], layers="greedy", text=None, tokens=int(tokens),
                                    heal_steps=0, heal_how="distill", out=None, device=None)
    runs = _reference_runs()
    names = sorted(runs["name"].dropna().unique())
    r1, r2 = st.columns([1, 3])
    base = r1.selectbox("Trained baseline run", names, index=names.index(DEMO_BASELINE) if DEMO_BASELINE in names else 0,
                        placeholder="no runs stored") if names else None
    others = r2.multiselect("Runs trained with the tie", names, default=[n for n in DEMO_TRAINED if n in names])
    trained = trained_points(runs, base, others) if base else trained_points(runs.iloc[:0], "", [])

    shown = [results[k] for k in keys.values() if k in results]
    figures.show(whatif_figure({whatif_label(r): curve(r) for r in shown}, trained, paper_points()),
                 key="whatif_curve")
    if not shown:
        st.info("Press Run to convert the checkpoint; the reference points are shown meanwhile.")
        return
    sample = shown[0]["sample"]
    windows = f"{sample['windows']} window" + ("s" if sample["windows"] != 1 else "")
    st.caption(f"{sample['n_tokens']} evaluation tokens in {windows}, the same for every target; "
               "interval: exp of the 95% t interval (N - 1 degrees of freedom) of the mean window loss. "
               "Each converted curve is against the checkpoint's own "
               "perplexity on this text, the trained runs against their Q-K-V run's final validation loss.")
    st.dataframe(pd.concat([curve(r).assign(target=r["target"], method=r["method"]) for r in shown],
                           ignore_index=True), hide_index=True)
    for r in shown:
        for k, note in r["notes"].items():
            st.caption(f"{md(r['target'])}, {md(k)}: {md(note)}")
