"""What if: what would sharing cost this model? A checkpoint converted post hoc, one layer at a
time in the cheapest order (``python -m app whatif --layers greedy``), drawn as the curve of KV
bytes saved against perplexity change, beside what training with the tie from scratch gave: the
stored runs chosen as reference points against their Q-K-V run (by default the demo's K=V- and
MQA-trained runs against its Q-K-V run), and the projection-sharing paper's trained variants
(``analysis.sharing_cost``). The conversion runs in a child process under the analysis budgets
(``loaders.sandbox``, job ``whatif``), on "Run"; its result is kept for this browser session only.
"""
from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st

from analysis.conversion import METHODS
from analysis.sharing_cost import curve, paper_points, trained_points
from app import figures
from app.paths import DEMO_DIR
from app.state import get_store
from loaders import curves
from loaders.run_table import run_table

TITLE = "What if"
ICON = ":material/call_split:"
ORDER = 45
URL_PATH = "what-if"

TARGETS = ("k_eq_v", "mqa", "gqa:2", "q_eq_k", "q_eq_k_eq_v", "latent:16")
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
    c1, c2, c3, c4 = st.columns([4, 2, 2, 1])
    path = c1.text_input("Checkpoint", str(DEFAULT_CHECKPOINT))
    target = c2.selectbox("Convert to", TARGETS)
    name = target.split(":")[0]
    method = c3.selectbox("Method", METHODS[name])
    tokens = c4.number_input("Tokens", min_value=64, max_value=65536, value=1024, step=256)
    key = (path, target, method, int(tokens))
    results = st.session_state.setdefault(_RESULTS, {})
    if st.button("Run", type="primary"):
        from app.sandbox_jobs import call   # here: only when a conversion runs

        with st.spinner("converting layer by layer..."):
            results[key] = call("whatif", path, timeout="QKVSCOPE_ANALYSIS_TIMEOUT_S",
                                to=target, method=method, layers="greedy", text=None, tokens=int(tokens),
                                heal_steps=0, heal_how="distill", out=None, device=None)
    runs = _reference_runs()
    names = sorted(runs["name"].dropna().unique())
    r1, r2 = st.columns([1, 3])
    base = r1.selectbox("Trained baseline run", names, index=names.index(DEMO_BASELINE) if DEMO_BASELINE in names else 0,
                        placeholder="no runs stored") if names else None
    others = r2.multiselect("Runs trained with the tie", names, default=[n for n in DEMO_TRAINED if n in names])
    trained = trained_points(runs, base, others) if base else trained_points(runs.iloc[:0], "", [])
    paper = paper_points()

    fig = go.Figure()
    result = results.get(key)
    if result is not None:
        c = curve(result)
        fig.add_trace(go.Scatter(x=c["kv_saved_pct"], y=c["delta_ppl_pct"], mode="lines+markers+text",
                                 text=c["layers"], textposition="top center",
                                 name=f"{result['target']} by {result['method']}, converted (greedy)"))
    fig.add_trace(go.Scatter(x=trained["kv_saved_pct"], y=trained["delta_ppl_pct"], mode="markers",
                             marker={"symbol": "diamond", "size": 11}, text=trained["label"],
                             name="trained with the tie (stored runs)"))
    fig.add_trace(go.Scatter(x=paper["kv_saved_pct"], y=paper["delta_ppl_pct"], mode="markers",
                             marker={"symbol": "star", "size": 12}, text=paper["label"],
                             name="trained with the tie (paper B, 300M)"))
    fig.update_layout(xaxis_title="KV cache saved (% of bytes per token)",
                      yaxis_title="perplexity change (%)", height=480)
    figures.show(fig, key="whatif_curve")
    if result is None:
        st.info("Press Run to convert the checkpoint; the reference points are shown meanwhile.")
        return
    st.caption(f"{result['sample']['n_tokens']} evaluation tokens in {result['sample']['windows']} windows; "
               "interval: 95% bootstrap over windows. The converted curve is against the checkpoint's own "
               "perplexity on this text, the trained runs against their Q-K-V run's final validation loss.")
    st.dataframe(curve(result), hide_index=True)
    for k, note in result["notes"].items():
        st.caption(f"{k}: {note}")
