"""The two papers' quantitative claims, as data, and the same quantities measured on a database.

``CLAIMS`` is the catalogue the Papers page, docs/guide/dashboard.md and the tests share:
one :class:`Claim` per number a paper states, with its units, where it is
stated (only what was read: a slide, the abstract, the repository README; no
table number that was not seen) and which measurement stands beside it.

Sources read (facts only):

* Paper A, query-free attention, arXiv 2510.23912, code
  ``MarkoKarbevski/Wqkv_necessity``: the arXiv abstract (two versions: "reducing
  attention parameters by 25%", "Training remains stable at over 3x lower weight
  decay"; v1 "reducing the number of non-embedding/lm-head parameters by over
  8%") and the repository's ``configs/configurator_creator.ipynb`` (the training
  configurations: identity queries with attention scale 1/(2 sqrt(d_head)) and
  weight decay 2**-5, the original with 1/sqrt(d_head) and 0.1; MLP factor 4.5
  for the identity model and 3.5 for the shrunk original).
* Paper B, projection sharing, arXiv 2606.04032, code
  ``Brainchip-Inc/Do-Transformers-Need-3-Projections``: its README (Q-K=V "50% KV
  cache reduction with only ~3% perplexity degradation", Q-MQA 96.9% at 300M;
  validation perplexity in Tables 4 and 10), the ICML poster and talk deck in
  its ``slides/`` folder (every other number below, slide by slide), and the
  KV-cache comparison its ``transformer_QMQA_1_2B.py`` prints at start (QKV
  "~5.9 GB" at 32k tokens; its own Q-MQA figure, bytes / 2^20, 88), and the authors'
  measurement script ``kv_similarity_llm.py`` with its output ``kv_similarity_results.csv``
  (per whole layer: the cosine of the flattened ``[W_k; b_k]`` and ``[W_v; b_v]`` and the linear
  CKA of the layer's K and V activations, averaged over layers; 0.0 and 0.6956 for the 300M
  model): ``analysis/metrics/whole_layer.py`` defines the same, and the K-V claims put them
  beside the per-head figures.

Not catalogued, because none of these sources states them (searched: the three repositories'
every file and every commit's diff at ``Wqkv_necessity`` e769434, ``beyond_query_linearity``
369d84e, ``Do-Transformers-Need-3-Projections`` ffedd92, the text and speaker notes of both
slide decks, the arXiv abstracts of both papers): "117M vs 124M" (GPT-2 small's announced
and counted sizes; a 124M GPT without W_Q counts 117.4M, 12 x 768^2 fewer, but neither paper
says so), "~7-14% model size" and "a 43% serving-cost cut". The 1.2B script's
"~5.9 GB -> 88 MB per user" is ``b_cache_per_user``; the Brainchip profiler's "~5-6% total,
~12-13% in attention" is a FLOP count, not a claim of the paper.

Like with like: a claim is set only beside runs or checkpoints of its head-sharing class
(``Claim.match["sharing"]``: ``MHA``, ``GQA-4``, ``MQA``, as ``analysis.variants.sharing`` names
them), within one project and geometry at a time (never a median or mean across them: a similarity
or rank gets one figure per group; a perplexity change is the per-token group with most runs,
the others named beside it), and a perplexity change only
where the runs' loss is per token (``loss_unit``); each claim names the model it was stated for
(``Claim.model``).

:func:`measure` puts beside each claim what the user's database says
(:class:`Inputs`, read by ``loaders.papers``): stored analysis results (with
their chance level and how many heads stand behind them), final validation
losses of runs per variant against ``qkv`` at the same weight decay (with the
number of runs and the seed spread), KV-cache and parameter savings of the
stored checkpoints' own geometry (``analysis.kv_cost``), and the weight-decay
sensitivity of ``analysis.wd_sensitivity``.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis.errors import AnalysisError
from analysis.kv_cost import (
    KV_TIED, VARIANT_LABELS, Attention, Geometry, attention_params, embedding_params,
    formula_params, geometry_from_info, kv_bytes_per_token, kv_bytes_per_user,
)
from analysis.gpus import GB, GIB
from analysis.presets import PRESETS
from analysis.variants import ALL_VARIANTS, sharing  # head-sharing class: MHA, GQA-g, MQA
from analysis.wd_sensitivity import relative_stability, wd_sensitivity

PAPER_A = "2510.23912"
PAPER_B = "2606.04032"
PAPERS = {
    PAPER_A: {"short": "Query-free attention", "code": "MarkoKarbevski/Wqkv_necessity",
              "title": "Key and Value Weights Are Probably All You Need (Karbevski, Mijoski)"},
    PAPER_B: {"short": "Projection sharing", "code": "Brainchip-Inc/Do-Transformers-Need-3-Projections",
              "title": "Do Transformers Need Three Projections? (Kayyam, Madan Gopal, Lewis; ICML 2026)"},
}

_POSTER = "repository slides/ICML Poster.pptx"
_DECK = "repository slides/ICML Talk Deck.pptx"
_NOTEBOOK = "repository configs/configurator_creator.ipynb (training configurations)"
_QMQA_SCRIPT = "repository transformer_QMQA_1_2B.py (the KV-cache comparison it prints at start)"
_KV_SCRIPT = ("repository kv_similarity_llm.py, its output kv_similarity_results.csv (row llm, fineweb_edu_300m, "
              "column {})")
#: How the authors' script defines its two figures (``analysis/metrics/whole_layer.py``).
_KV_SCRIPT_DEFINITION = ("The authors' definition (kv_similarity_llm.py): per whole layer, {}, averaged over the "
                         "layers; qkvscope's {} is that per layer, and the figure here is its mean over each "
                         "checkpoint's layers")
#: The models the claims were stated for.
_A_SMALL = "~124M GPT (12 layers, d_model 768, 12 heads, MHA)"
_B_300M = "300M (20 layers, d_model 1024, 16 heads)"
_B_1_2B = "1.2B (22 layers, d_model 2048, 32 heads)"


@dataclass(frozen=True)
class Claim:
    """One number a paper states.

    ``measure`` names the measurement put beside it (see :func:`measure`);
    ``match`` narrows it (a variant, a head-sharing class as ``analysis.variants.sharing``
    writes it: ``MHA``, ``GQA-4``, ``MQA``; a preset). ``value`` is the paper's number in
    ``units``; ``where`` is the place it was read; ``model`` the model it was stated for.
    """

    key: str
    arxiv: str
    claim: str
    value: float
    units: str
    where: str
    measure: str
    match: dict = field(default_factory=dict)
    note: str = ""
    model: str = ""


CLAIMS: tuple[Claim, ...] = (
    # -- Paper A: query-free attention ----------------------------------------------------
    Claim("a_attention_params", PAPER_A, "W_Q = identity removes 25% of the attention parameters",
          25.0, "% of attention parameters", "abstract", "query_free_saving",
          note="True for multi-head attention only (W_Q, W_K, W_V, W_O all d x d); with grouped K/V heads "
               "W_Q is a larger share: n_heads / (2 n_heads + 2 n_kv_heads)", model="any multi-head attention layer"),
    Claim("a_nonembedding_params", PAPER_A, "W_Q = identity removes over 8% of the non-embedding parameters",
          8.0, "% of non-embedding parameters (lower bound)", "abstract (arXiv v1)", "query_free_nonembedding",
          match={"preset": "query-free-124m"}, model=_A_SMALL),
    Claim("a_attn_scale", PAPER_A, "query-free models train with attention scale 1/(2 sqrt(d_head))",
          0.5, "x 1/sqrt(d_head)", _NOTEBOOK, "attn_scale", match={"variant": "wq_identity"}, model=_A_SMALL),
    Claim("a_weight_decay", PAPER_A, "query-free models train with weight decay 0.03125 (2^-5) instead of 0.1",
          0.03125, "weight decay", _NOTEBOOK, "weight_decays", match={"variant": "wq_identity"}, model=_A_SMALL),
    Claim("a_stable_lower_wd", PAPER_A, "training stays stable at over 3x lower weight decay",
          3.2, "x lower weight decay (0.1 / 0.03125)", "abstract", "wd_stability",
          match={"variant": "wq_identity"}, model=_A_SMALL),
    Claim("a_mlp_wider", PAPER_A, "parameter-matched comparison: the query-free model spends the saved "
          "parameters on a wider MLP", 4.5, "x d_model (MLP width)", _NOTEBOOK, "mlp_ratio",
          match={"variant": "wq_identity"}, model=_A_SMALL),
    Claim("a_mlp_narrower", PAPER_A, "parameter-matched comparison: the baseline is shrunk to match",
          3.5, "x d_model (MLP width)", _NOTEBOOK, "mlp_ratio", match={"variant": "qkv"}, model=_A_SMALL),
    # -- Paper B: projection sharing ------------------------------------------------------
    Claim("b_kv_cosine", PAPER_B, "trained QKV models: K-V cosine similarity 0.73",
          0.73, "cosine", f"{_DECK}, slide 6; {_POSTER}", "kv_similarity", match={"sharing": "MHA"},
          note="The authors' script (kv_similarity_llm.py) gives their 300M model a whole-layer weight cosine of "
               "0.0 and a whole-layer activation CKA of 0.6956 (the next two rows): the deck's 0.73 is nearest the "
               "activation CKA, whatever its label. A flat cosine compares the two matrices entry by entry, so it "
               "depends on each head's output basis: K -> K R with Q -> Q R, and V -> V R' with W_O -> R'^T W_O, "
               "change no attention output but change cos(vec K, vec V), which can read ~0 for K and V that read "
               "the same input directions. Linear CKA is invariant to such rotations", model=_B_300M),
    Claim("b_kv_cka_layer", PAPER_B, "trained QKV 300M model: linear CKA of a whole layer's K and V activations, "
          "averaged over layers, 0.6956", 0.6956, "linear CKA, mean over layers", _KV_SCRIPT.format("activation_cka"),
          "kv_layer_cka", match={"sharing": "MHA"},
          note=_KV_SCRIPT_DEFINITION.format(
              "the linear CKA of the K and V outputs of the fused c_attn (biases in) over one batch of 8 validation "
              "sequences, all n_embd columns, tokens centred, not debiased", "kv_cka_layer_act")
          + ". Not debiased, this CKA reads high by about tr(Kc^T Kc) tr(Vc^T Vc) / (n ||Kc^T Kc|| ||Vc^T Vc||) on "
            "n tokens, a floor the chance level carries too: compare values on similar token counts. Their "
            "results CSV gives 0.53-0.75 for vision models and 0.65-0.94 for synthetic tasks", model=_B_300M),
    Claim("b_kv_cos_layer", PAPER_B, "trained QKV 300M model: cosine of a whole layer's flattened K and V weights "
          "with biases, averaged over layers, 0.0", 0.0, "cosine, mean over layers", _KV_SCRIPT.format("weight_cos_sim"),
          "kv_layer_cosine", match={"sharing": "MHA"},
          note=_KV_SCRIPT_DEFINITION.format(
              "the cosine of the flattened [W_k; b_k] and [W_v; b_v] of the fused c_attn, every head", "kv_cosine_layer")
          + ". Like the per-head flat cosine it depends on each head's output basis", model=_B_300M),
    Claim("b_qk_cosine", PAPER_B, "trained QKV models: Q stays distinct, cos(Q,K) 0.42",
          0.42, "cosine", f"{_DECK}, slide 6", "not_measured",
          note="qkvscope computes no flat Q/K cosine; qk_symmetry_paper (Inspector) measures how symmetric "
               "W_Q W_K^T is on the scale Saponati et al. 2025 plot (2 s - 1: 1 symmetric, 0 random; "
               "qk_symmetry is s, as their utils/scores.py computes it). For grouped-query models their code "
               "reshapes W_K as if it had n_heads heads; qkvscope pairs each query head with its own kv head",
          model=_B_300M),
    Claim("b_qv_cosine", PAPER_B, "trained QKV models: cos(Q,V) 0.31", 0.31, "cosine", f"{_DECK}, slide 6",
          "not_measured", note="qkvscope computes no flat Q/V cosine", model=_B_300M),
    Claim("b_kv_erank", PAPER_B, "trained QKV models: K and V have similar effective rank, 687 vs 702 of 1024",
          687 / 1024, "effective rank / cache width (K; V 702/1024 = 0.686)", f"{_DECK}, slide 6", "kv_erank",
          match={"sharing": "MHA"},
          note="1024 is the 300M model's d_model, the width of a whole layer's K or V cache (16 heads of 64): a "
               "whole-layer figure, set beside erank_kcache_layer and erank_vcache_layer (effective rank of the "
               "[tokens, n_kv_heads*d_head] caches on sample tokens). No script or result file read in the repository "
               "computes 687 or 702, so whether the deck's ranks are of the weights or of the caches, and on how many "
               "tokens, is not known",
          model=_B_300M),
    Claim("b_ppl_kv_300m", PAPER_B, "Q-K=V costs +3.1% validation perplexity at 300M (5.27 vs 5.11)",
          3.1, "% validation perplexity vs QKV", f"{_DECK}, slides 5 and 10; {_POSTER}; README: ~3%, "
          "validation perplexity in Tables 4 and 10", "relative_loss",
          match={"variant": "k_eq_v", "sharing": "MHA"}, model=_B_300M),
    Claim("b_ppl_kv_1_2b", PAPER_B, "Q-K=V costs +2.48% validation perplexity at 1.2B",
          2.48, "% validation perplexity vs QKV", f"{_DECK}, slides 8 and 10; {_POSTER}", "relative_loss",
          match={"variant": "k_eq_v", "sharing": "MHA"}, model=_B_1_2B),
    Claim("b_ppl_qk", PAPER_B, "Q=K-V costs +4.9% validation perplexity (300M), with no cache benefit",
          4.9, "% validation perplexity vs QKV", f"{_DECK}, slide 6; {_POSTER}", "relative_loss",
          match={"variant": "q_eq_k", "sharing": "MHA"}, model=_B_300M),
    Claim("b_ppl_qkv_tied", PAPER_B, "Q=K=V costs +25.4% validation perplexity (300M)",
          25.4, "% validation perplexity vs QKV", f"{_DECK}, slides 5 and 6; {_POSTER}", "relative_loss",
          match={"variant": "q_eq_k_eq_v", "sharing": "MHA"}, model=_B_300M),
    Claim("b_ppl_gqa", PAPER_B, "GQA-4 costs +0.7% validation perplexity", 0.7,
          "% validation perplexity vs QKV", f"{_DECK}, slide 9", "relative_loss",
          match={"variant": "qkv", "sharing": "GQA-4"}, model=_B_300M),
    Claim("b_ppl_q_gqa", PAPER_B, "Q-GQA-4 (K=V with GQA-4) costs +3.9% validation perplexity", 3.9,
          "% validation perplexity vs QKV", f"{_DECK}, slide 9", "relative_loss",
          match={"variant": "k_eq_v", "sharing": "GQA-4"}, model=_B_300M),
    Claim("b_ppl_q_mqa", PAPER_B, "Q-MQA (K=V with MQA) costs +4.8% validation perplexity", 4.8,
          "% validation perplexity vs QKV", f"{_DECK}, slide 9", "relative_loss",
          match={"variant": "k_eq_v", "sharing": "MQA"}, model=_B_300M),
    Claim("b_downstream_1_2b", PAPER_B, "at 1.2B Q-K=V trails QKV by only 0.41 points of 5-shot downstream "
          "accuracy (35.99 vs 36.40)", 0.41, "accuracy points", f"{_DECK}, slide 8; {_POSTER}", "not_measured",
          note="qkvscope runs no downstream evaluation", model=_B_1_2B),
    Claim("b_proj_cost", PAPER_B, "projection cost drops 33% per tie: 3nd^2 -> 2nd^2 -> nd^2",
          100 / 3, "% of the Q, K, V projection parameters", _POSTER, "kv_projection_saving",
          note="n d^2 per projection holds for multi-head attention; with grouped K/V heads W_V is a smaller share", model="any multi-head attention layer"),
    Claim("b_cache_kv", PAPER_B, "Q-K=V halves the KV cache", 50.0, "% KV cache saved",
          f"README; {_DECK}, slide 5", "kv_saving", match={"variant": "k_eq_v", "sharing": "MHA",
                                                          "preset": "projection-sharing-300m", "kv_frac": 1.0}, model=_B_300M),
    Claim("b_cache_gqa", PAPER_B, "GQA-4 saves 75% of the KV cache", 75.0, "% KV cache saved",
          f"{_DECK}, slides 4 and 9", "kv_saving", match={"variant": "qkv", "sharing": "GQA-4",
                                                         "preset": "projection-sharing-300m", "kv_frac": 0.25}, model=_B_300M),
    Claim("b_cache_q_gqa", PAPER_B, "Q-GQA-4 saves 87.5% of the KV cache", 87.5, "% KV cache saved",
          f"{_DECK}, slides 4 and 9", "kv_saving", match={"variant": "k_eq_v", "sharing": "GQA-4",
                                                         "preset": "projection-sharing-300m", "kv_frac": 0.25}, model=_B_300M),
    Claim("b_cache_q_mqa", PAPER_B, "Q-MQA saves 96.9% of the KV cache at 300M", 96.9, "% KV cache saved",
          f"README; {_DECK}, slides 4 and 7", "kv_saving", match={"variant": "k_eq_v", "sharing": "MQA",
                                                                 "preset": "projection-sharing-300m"}, model=_B_300M),
    Claim("b_cache_67x", PAPER_B, "up to 67x cache reduction with Q-MQA", 67.0, "x smaller KV cache", _POSTER,
          "kv_ratio", match={"variant": "k_eq_v", "sharing": "MQA", "preset": "projection-sharing-1.2b"},
          note="the consistent ratio is 64x (2 x 32 KV heads against 1): 67x is 64 x 2^20 / 10^6, a size in "
               "MiB set against one in MB", model=_B_1_2B),
    Claim("b_cache_per_user", PAPER_B, "Q-MQA cuts one user's KV cache at 32k tokens of context from ~5.9 GB "
          "(QKV) to 88 MB", 88.0, "MB per user at 32,768 tokens (QKV: 5.9 GB)", _QMQA_SCRIPT, "kv_per_user",
          match={"variant": "k_eq_v", "sharing": "MQA", "preset": "projection-sharing-1.2b", "context": 32768},
          note="The script sizes the cache in bf16 (2 bytes per element) and divides its own Q-MQA figure by "
               "2^20 (MiB, printed as GB), while 5.9 is bytes / 10^9 (GB): the same mix of units as the 67x",
          model=_B_1_2B),
)

BY_KEY = {c.key: c for c in CLAIMS}

#: What :func:`measure` returns, one row per claim.
TABLE_COLUMNS = ["key", "paper", "claim", "model", "paper_value", "units", "where", "measured", "chance", "n",
                 "reading", "source"]


@dataclass
class Inputs:
    """What :func:`measure` reads; ``loaders.papers.paper_inputs`` fills it from a store.

    * ``checkpoints``: ``id, run_id, step, variant, n_layers, n_heads, n_kv_heads, d_model, d_head,
      attn_scale, params_total, params_attention`` (the checkpoints compared);
    * ``results``: ``checkpoint_id, variant, layer, head, metric, value, chance, n_tokens, ci_low,
      ci_high`` of those checkpoints (latest metric version);
    * ``runs``: ``run_id, name, variant, n_kv_heads, n_heads, weight_decay, seed, mlp_ratio, config,
      final`` (``final``: the final value of ``loss_metric``);
    * ``points``: the curves of ``loss_metric`` (for the weight-decay statistics), as
      ``analysis.wd_sensitivity`` takes them: a ``run_id, step, value`` frame, or an iterable of
      ``(run_id, values in step order)`` (``loaders.curves.StoredCurves``, read when used).
    """

    checkpoints: pd.DataFrame
    results: pd.DataFrame
    runs: pd.DataFrame
    points: pd.DataFrame | Iterable[tuple[int, np.ndarray]]
    loss_metric: str = "val/loss"


def _geometry(row) -> Geometry | None:
    info = {k: (None if pd.isna(row.get(k)) else row.get(k)) for k in
            ("n_layers", "n_heads", "n_kv_heads", "d_model", "d_head", "params_total", "params_attention")}
    info["variant"] = row.get("variant") if row.get("variant") in ALL_VARIANTS else "qkv"
    try:
        return geometry_from_info(info, name=f"checkpoint {row.get('id')}")
    except AnalysisError:
        return None


def geometry_savings(checkpoints: pd.DataFrame) -> pd.DataFrame:
    """Per distinct geometry of the stored checkpoints: what each tie saves, from ``analysis.kv_cost``.

    Returns ``n_heads, n_kv_heads, d_model, d_head, sharing, n_checkpoints, wq_share`` (the fraction of
    the ``qkv`` attention parameters that W_Q = I removes: ``1 - attn(wq_identity) / attn(qkv)``, biases
    as the checkpoint has them) and ``wv_share`` (the fraction of the Q, K, V projection parameters a
    K = V tie removes: ``n_kv_heads / (n_heads + 2 n_kv_heads)``).
    """
    cols = ["n_heads", "n_kv_heads", "d_model", "d_head", "sharing", "n_checkpoints", "wq_share", "wv_share"]
    rows = {}
    for _, r in checkpoints.iterrows():
        g = _geometry(r)
        if g is None:
            continue
        key = (g.n_heads, g.n_kv_heads, g.d_model, g.d_head)
        if key in rows:
            rows[key]["n_checkpoints"] += 1
            continue
        full = attention_params(g, Attention("qkv", g.n_kv_heads))
        free = attention_params(g, Attention("wq_identity", g.n_kv_heads))
        rows[key] = {"n_heads": g.n_heads, "n_kv_heads": g.n_kv_heads, "d_model": g.d_model, "d_head": g.d_head,
                     "sharing": sharing(g.n_heads, g.n_kv_heads), "n_checkpoints": 1,
                     "wq_share": 1 - free / full,
                     "wv_share": g.n_kv_heads / (g.n_heads + 2 * g.n_kv_heads)}
    return pd.DataFrame(list(rows.values()), columns=cols)


#: Geometry columns a comparison never crosses (with the project and the loss's unit).
GEOMETRY = ("d_model", "n_layers", "n_heads")


def loss_unit(vocab_size=None, tokenizer=None) -> str:
    """What one step of a run's loss is over: ``token`` when its config names a tokenizer or a
    vocabulary larger than 256, ``byte`` for a vocabulary of at most 256 (a byte-level model, such
    as the bundled demo's), ``?`` when the config says neither. Only ``token`` losses are compared
    with the papers' per-token perplexities."""
    if tokenizer:
        return "token"
    try:
        vocab = int(vocab_size)
    except (TypeError, ValueError):
        return "?"
    return "byte" if vocab <= 256 else "token"


def _upper_first(text: str) -> str:
    return text[:1].upper() + text[1:]


def _text(value) -> str:
    return "?" if value is None or pd.isna(value) else str(value)


def _label(value) -> str:
    return "?" if value is None or pd.isna(value) else str(int(value))


def geometry_label(row) -> str:
    """``d_model 64, 4 layers, 4 heads`` (``?`` where unknown)."""
    return (f"d_model {_label(row.get('d_model'))}, {_label(row.get('n_layers'))} layers, "
            f"{_label(row.get('n_heads'))} heads")


def relative_losses(runs: pd.DataFrame) -> pd.DataFrame:
    """Final loss of each variant and head-sharing class against ``qkv`` MHA runs of the same
    group at the same weight decay: a group is one project, one unit of the loss (``loss_unit``:
    per token, per byte, ``?``) and one geometry (``GEOMETRY``, where the frame has the columns;
    an unknown value matches only itself), never across them.

    Per matched cell (group, weight decay w) where both exist: ``rel = mean(final_v) / mean(final_qkv) - 1`` and, reading the
    loss as nats per token (or byte), the perplexity change ``exp(mean(final_v) - mean(final_qkv)) - 1``. Returns
    one row per (group, variant, sharing): ``project, loss_unit, d_model, n_layers, n_heads, variant, sharing,
    rel_loss, rel_ppl`` (means over the group's matched weight decays), ``weight_decays``, ``n_runs`` (the
    variant's runs used), ``n_base`` (qkv runs used) and ``seed_spread_ppl`` (largest minus smallest
    baseline final at one weight decay of the group, as a perplexity ratio, NaN without repeated
    baseline runs): the noise a difference has to beat. ``sharing`` is ``analysis.variants.sharing``'s
    class (``MHA``, ``GQA-g``, ``MQA``).
    """
    cols = ["project", "loss_unit", *GEOMETRY, "variant", "sharing", "rel_loss", "rel_ppl", "weight_decays",
            "n_runs", "n_base", "seed_spread_ppl"]
    need = {"variant", "n_heads", "n_kv_heads", "weight_decay", "final"}
    missing = sorted(need - set(runs.columns))
    if missing:
        raise AnalysisError(f"relative_losses: runs frame lacks columns {missing}; found {sorted(runs.columns)}")
    frame = runs[runs["final"].notna() & np.isfinite(runs["final"].astype(float))].copy()
    if frame.empty:
        return pd.DataFrame(columns=cols)
    frame["sharing"] = [sharing(h, k) for h, k in zip(frame["n_heads"], frame["n_kv_heads"])]
    frame["wd"] = frame["weight_decay"].astype(float).fillna(-1.0)  # unknown weight decay: its own cell
    for c in ("project", "loss_unit"):
        frame[c] = frame[c].map(_text) if c in frame.columns else "?"
    for c in GEOMETRY:
        frame[f"_{c}"] = frame[c].map(_label) if c in frame.columns else "?"
    group_cols = ["project", "loss_unit", *(f"_{c}" for c in GEOMETRY)]
    rows = []
    for key, gframe in frame.groupby(group_cols, sort=True):
        base = gframe[(gframe["variant"] == "qkv") & (gframe["sharing"] == "MHA")]
        base_mean = base.groupby("wd")["final"].mean()
        spreads = base.groupby("wd")["final"].agg(lambda s: s.max() - s.min() if len(s) > 1 else np.nan)
        spread = float(np.exp(spreads.max()) - 1) if spreads.notna().any() else float("nan")
        geometry = {c: (None if v == "?" else int(v)) for c, v in zip(GEOMETRY, key[2:])}
        for (variant, kind), grp in gframe.groupby(["variant", "sharing"], sort=True):
            if variant == "qkv" and kind == "MHA":
                continue
            cells = grp[grp["wd"].isin(base_mean.index)]
            if cells.empty:
                continue
            means = cells.groupby("wd")["final"].mean()
            ref = base_mean.loc[means.index]
            rows.append({"project": key[0], "loss_unit": key[1], **geometry, "variant": variant, "sharing": kind,
                         "rel_loss": float((means / ref - 1).mean()),
                         "rel_ppl": float((np.exp(means - ref) - 1).mean()),
                         "weight_decays": sorted((None if w < 0 else float(w) for w in means.index),
                                                 key=lambda w: -1 if w is None else w),
                         "n_runs": int(len(cells)),
                         "n_base": int(base["wd"].isin(means.index).sum()),
                         "seed_spread_ppl": spread})
    return pd.DataFrame(rows, columns=cols)


def kv_saving(geometry: Geometry, variant: str, n_kv_heads: int) -> float:
    """Fraction of the ``qkv`` MHA cache a configuration saves: ``1 - bytes(variant, kv) / bytes(qkv, n_heads)``
    (``analysis.kv_cost.kv_bytes_per_token``; the dtype cancels)."""
    base = kv_bytes_per_token(geometry, Attention("qkv", geometry.n_heads), "bf16")
    return 1 - kv_bytes_per_token(geometry, Attention(variant, n_kv_heads), "bf16") / base


def _pct(x: float, digits: int = 1) -> str:
    return f"{100 * x:+.{digits}f}%"


def _num(x, digits: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


#: The stored metrics the measurements read, with their labels (``loaders.papers`` reads ``METRICS``).
SIMILARITY_METRICS = (("kv_cosine_flat", "flat cosine"), ("kv_cka", "CKA"), ("kv_cka_act", "CKA on activations"))
#: The whole-layer figures of the projection-sharing paper's kv_similarity_llm.py (``analysis/metrics/whole_layer.py``),
#: each shown as a mean over a checkpoint's layers, as the script averages them.
LAYER_SIMILARITY_METRICS = (("kv_cosine_layer", "whole-layer weight cosine"),
                            ("kv_cka_layer_act", "whole-layer activation CKA"))
#: The whole layer's K and V cache effective ranks, and the per-head ones set beside them.
ERANK_METRICS = ("erank_kcache_layer", "erank_vcache_layer")
HEAD_ERANK_METRICS = ("erank_kcache", "erank_vcache")
METRICS = (*(m for m, _ in SIMILARITY_METRICS), *(m for m, _ in LAYER_SIMILARITY_METRICS), *ERANK_METRICS,
           *HEAD_ERANK_METRICS)

def _with_groups(results: pd.DataFrame, checkpoints: pd.DataFrame, kind: str | None) -> pd.DataFrame:
    """``results`` with each row's checkpoint ``project``, geometry, cache width ``width`` (``n_kv_heads *
    d_head``) and head-sharing class (``sharing``) and a ``group`` label (``project P, d_model 64, 4 layers,
    4 heads``); only the checkpoints of the head-sharing class ``kind`` (all for None)."""
    ck = checkpoints.copy()
    ck["project"] = ck["project"].map(_text) if "project" in ck.columns else "?"
    ck["sharing"] = [sharing(h, k) for h, k in zip(ck["n_heads"], ck["n_kv_heads"])]
    ck["group"] = [_group_text(r) for r in ck.to_dict("records")]
    ck["d_model"] = ck["d_model"].astype(float)
    ck["d_head"] = ck["d_head"].astype(float)
    ck["width"] = ck["n_kv_heads"].astype(float) * ck["d_head"]
    keep = ["id", "project", "sharing", "group", "d_model", "d_head", "width"]
    out = results.merge(ck[keep].rename(columns={"id": "checkpoint_id"}), on="checkpoint_id", how="inner")
    return out if kind is None else out[out["sharing"] == kind]


def _separate(results: pd.DataFrame, metric: str, *, per_head: bool) -> pd.DataFrame:
    """Rows of ``metric`` on checkpoints whose K and V are separate (tied ones are 1 by construction),
    per head (``per_head``) or per whole layer (``head`` empty)."""
    if results.empty:
        return results
    heads = results["head"].notna() if per_head else results["head"].isna()
    sub = results[(results["metric"] == metric) & heads & ~results["variant"].isin(sorted(KV_TIED))]
    return sub[sub["value"].notna()]


def _similarity_rows(results: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per-head rows of ``metric`` on checkpoints whose K and V are separate (tied ones are 1 by construction)."""
    return _separate(results, metric, per_head=True)


def _summary(rows: pd.DataFrame, label: str) -> tuple[str, str, int]:
    """``(measured, chance, n)`` of per-head rows: median and range, median chance."""
    if rows.empty:
        return "", "", 0
    v = rows["value"].astype(float)
    measured = f"{label} median {v.median():.3f} (range {v.min():.3f} to {v.max():.3f})"
    ch = rows["chance"].astype(float).dropna() if "chance" in rows else pd.Series(dtype=float)
    chance = f"{ch.median():.3f}" if len(ch) else "chance not computed yet"
    return measured, chance, int(len(rows))


def _layer_means(rows: pd.DataFrame, scale: str | None = None) -> pd.DataFrame:
    """Per checkpoint, the mean over its layers of ``value`` and ``chance`` (each divided by the column
    ``scale`` first, where given): ``value, chance, low, high, layers``."""
    rows = rows.assign(v=rows["value"].astype(float), c=rows["chance"].astype(float))
    if scale is not None:
        rows = rows.assign(v=rows["v"] / rows[scale], c=rows["c"] / rows[scale])
    out = rows.groupby("checkpoint_id").agg(value=("v", "mean"), chance=("c", "mean"), low=("v", "min"),
                                            high=("v", "max"), layers=("v", "size"))
    # a checkpoint with a layer lacking its chance level has none for the mean
    missing = rows.groupby("checkpoint_id")["c"].apply(lambda c: c.isna().any())
    return out.assign(chance=out["chance"].where(~missing))


def _layer_summary(rows: pd.DataFrame, label: str, scale: str | None = None) -> tuple[str, str, int, int]:
    """``(measured, chance, layers, checkpoints)`` of per-layer rows: each checkpoint's mean over its
    layers (the authors' average), for one checkpoint with the layers' range, for several their median and
    range; the chance level likewise."""
    if rows.empty:
        return "", "", 0, 0
    per = _layer_means(rows, scale)
    if len(per) == 1:
        r = per.iloc[0]
        measured = (f"{label} mean over {int(r['layers'])} layers {r['value']:.3f} (layers {r['low']:.3f} to "
                    f"{r['high']:.3f})")
    else:
        measured = (f"{label} mean over layers, median of {len(per)} checkpoints {per['value'].median():.3f} "
                    f"(range {per['value'].min():.3f} to {per['value'].max():.3f})")
    ch = per["chance"].dropna()
    chance = f"{label}: " + (f"{ch.median():.3f}" if len(ch) else "chance not computed yet")
    return measured, chance, int(per["layers"].sum()), int(len(per))


def _by_group(rows: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """``rows`` per group (project and geometry), the group with most rows first."""
    groups = [(g, part) for g, part in rows.groupby("group", sort=True)]
    return sorted(groups, key=lambda gp: -len(gp[1]))


def _tokens_text(rows: pd.DataFrame) -> str:
    tokens = rows["n_tokens"].dropna() if len(rows) and "n_tokens" in rows else []
    return f" on {int(pd.Series(tokens).median()):,} tokens" if len(tokens) else ""


def _kv_similarity(claim: Claim, data: Inputs) -> dict:
    kind = claim.match.get("sharing")
    res = _with_groups(data.results, data.checkpoints, kind) if not data.results.empty else data.results
    parts_of = [(_similarity_rows, m, label) for m, label in SIMILARITY_METRICS] + \
               [(lambda r, m: _separate(r, m, per_head=False), m, label) for m, label in LAYER_SIMILARITY_METRICS]
    rows = pd.concat([pick(res, m) for pick, m, _ in parts_of]) if not res.empty else res
    if rows.empty:
        return {"measured": None, "reading": f"No analysed {kind or ''} checkpoint with separate K and V yet: "
                                             "analyse the checkpoints (button above) to measure it."
                                             .replace("  ", " ")}
    groups = _by_group(rows)
    measured, chances, n = [], [], 0
    for group, part in groups:
        parts, group_chances, k_max = [], [], 0
        for metric, label in SIMILARITY_METRICS:
            m, c, k = _summary(part[(part["metric"] == metric) & part["head"].notna()], label)
            if k:
                parts.append(m)
                group_chances.append(f"{label}: {c}")
                k_max = max(k_max, k)
        layer_parts = []
        for metric, label in LAYER_SIMILARITY_METRICS:
            m, c, _layers, _k = _layer_summary(part[(part["metric"] == metric) & part["head"].isna()], label)
            if m:
                layer_parts.append(m)
                group_chances.append(c)
        if layer_parts:
            parts.append("authors' definitions (kv_similarity_llm.py): " + ", ".join(layer_parts))
        prefix = f"[{group}] " if len(groups) > 1 else ""
        measured.append(prefix + "; ".join(parts))
        chances.append(prefix + "; ".join(group_chances))
        n += k_max
    act = rows[rows["metric"] == "kv_cka_act"]
    where = f"{_upper_first(groups[0][0])}: p" if len(groups) == 1 else "One figure per project and geometry, never pooled. P"
    reading = (where + f"er kv head of {kind or 'all'} checkpoints with separate K and V (K=V variants read 1 by "
               f"construction), and the authors' whole-layer figures as their mean over each checkpoint's layers; "
               f"the paper's model: {claim.model}. " + claim.note + ".")
    if len(act):
        reading += f" Activation CKA{_tokens_text(act)}."
    return {"measured": " | ".join(measured), "chance": " | ".join(chances), "n": n,
            "n_label": "kv heads" if len(groups) == 1 else f"kv heads in {len(groups)} groups", "reading": reading}


#: The authors' whole-layer figure of each measurement, its label, and the per-head figure kept beside it.
_LAYER_FIGURES = {"kv_layer_cka": ("kv_cka_layer_act", "whole-layer activation CKA", "kv_cka_act",
                                   "per-head CKA on activations"),
                  "kv_layer_cosine": ("kv_cosine_layer", "whole-layer weight cosine", "kv_cosine_flat",
                                      "per-head flat cosine")}


def _kv_layer(claim: Claim, data: Inputs) -> dict:
    """One of the authors' whole-layer figures (``_LAYER_FIGURES``) per project and geometry: each
    checkpoint's mean over its layers, the per-head figure beside it."""
    metric, label, head_metric, head_label = _LAYER_FIGURES[claim.measure]
    kind = claim.match.get("sharing")
    res = _with_groups(data.results, data.checkpoints, kind) if not data.results.empty else data.results
    layer = _separate(res, metric, per_head=False) if not res.empty else res
    how = ("analyse them with activations (python -m app analyze ID --activations)"
           if metric.endswith("_act") else "analyse the checkpoints (button above)")
    if layer.empty:
        return {"measured": None, "reading": f"No {metric} stored for {kind} checkpoints with separate K and V: "
                                             f"{how}. " + claim.note + "."}
    heads = _separate(res, head_metric, per_head=True)
    groups = _by_group(layer)
    measured, chances, layers, ckpts = [], [], 0, 0
    for group, part in groups:
        m, c, n_layers, k = _layer_summary(part, label)
        h, hc, _ = _summary(heads[heads["group"] == group], head_label)
        prefix = f"[{group}] " if len(groups) > 1 else ""
        measured.append(prefix + m + (f"; beside it {h}" if h else ""))
        chances.append(prefix + c + (f"; {head_label}: {hc}" if h else ""))
        layers, ckpts = layers + n_layers, ckpts + k
    where = f"{_upper_first(groups[0][0])}: " if len(groups) == 1 else "One figure per project and geometry, never pooled. "
    reading = (where + f"{metric} of {kind} checkpoints with separate K and V{_tokens_text(layer)}; the paper's "
               f"model: {claim.model}. " + claim.note + ".")
    return {"measured": " | ".join(measured), "chance": " | ".join(chances), "n": layers,
            "n_label": f"layers of {ckpts} checkpoints" + (f" in {len(groups)} groups" if len(groups) > 1 else ""),
            "reading": reading}


def _kv_erank(claim: Claim, data: Inputs) -> dict:
    res = data.results
    if res.empty:
        return {"measured": None, "reading": "No analysed checkpoint yet."}
    kind = claim.match.get("sharing")
    res = _with_groups(res, data.checkpoints, kind)
    layer = pd.concat([_separate(res, m, per_head=False) for m in ERANK_METRICS])
    if layer.empty:
        return {"measured": None, "reading": f"No whole-layer K/V cache effective rank stored for {kind} checkpoints "
                                             "with separate K and V: analyse them with activations (python -m app "
                                             "analyze ID --activations). " + claim.note + "."}
    heads = pd.concat([_separate(res, m, per_head=True) for m in HEAD_ERANK_METRICS])
    groups = _by_group(layer)
    measured, chances, n = [], [], 0
    for group, part in groups:
        prefix = f"[{group}] " if len(groups) > 1 else ""
        k = _layer_means(part[part["metric"] == "erank_kcache_layer"])
        v = _layer_means(part[part["metric"] == "erank_vcache_layer"])
        width = int(part["width"].iloc[0])
        text = (f"K cache {k['value'].median():.1f} vs V cache {v['value'].median():.1f} of {width} "
                f"({k['value'].median() / width:.3f}, {v['value'].median() / width:.3f} of the width)")
        if len(k) > 1:
            text += f", mean over layers, median of {len(k)} checkpoints"
        else:
            text += ", mean over layers"
        hk = heads[(heads["group"] == group) & (heads["metric"] == "erank_kcache")]
        hv = heads[(heads["group"] == group) & (heads["metric"] == "erank_vcache")]
        if len(hk) and len(hv):
            e = int(part["d_head"].iloc[0])
            text += (f"; beside it per head K {hk['value'].astype(float).median():.1f} vs V "
                     f"{hv['value'].astype(float).median():.1f} of {e} (medians over {len(hk)} kv heads)")
        measured.append(prefix + text)
        ch = pd.concat([k["chance"], v["chance"]]).dropna()
        chances.append(prefix + (f"{ch.median():.1f} of {width} ({ch.median() / width:.3f})" if len(ch)
                                 else "chance not computed yet"))
        n += int(k["layers"].sum())
    where = f"{_upper_first(groups[0][0])}: " if len(groups) == 1 else "One figure per project and geometry, never pooled. "
    return {"measured": " | ".join(measured), "chance": " | ".join(chances), "n": n, "n_label": "layers",
            "reading": where + f"effective rank of each layer's whole K and V caches (tokens x n_kv_heads*d_head) of "
                       f"{kind} checkpoints{_tokens_text(layer)}, the mean over each checkpoint's layers; the paper's "
                       f"model: {claim.model}. " + claim.note + "."}


def _geometry_share(data: Inputs, column: str, prefix: str, reading: str) -> dict:
    """A parameter share (``column`` of ``geometry_savings``) per stored geometry, largest last."""
    geo = geometry_savings(data.checkpoints)
    if geo.empty:
        return {"measured": None, "reading": "No stored checkpoint with a complete geometry."}
    parts = [f"{r.sharing} ({r.n_kv_heads} of {r.n_heads} KV heads): {100 * getattr(r, column):.1f}%"
             for r in geo.sort_values(column).itertuples()]
    return {"measured": prefix + "; ".join(parts), "chance": "no chance level (a parameter count)",
            "n": int(geo["n_checkpoints"].sum()), "n_label": "checkpoints", "reading": reading}


def _query_free(claim: Claim, data: Inputs) -> dict:
    return _geometry_share(data, "wq_share", "",
                           "W_Q's share of each stored geometry's qkv attention parameters (analysis.kv_cost). "
                           + claim.note + ".")


def _query_free_nonembedding(claim: Claim, data: Inputs) -> dict:
    g = PRESETS[claim.match["preset"]]
    inputs, head = embedding_params(g)
    base = formula_params(g, Attention("qkv", g.n_kv_heads)) - inputs - head
    wq = g.n_layers * g.d_model * g.n_heads * g.d_head
    return {"measured": f"{100 * wq / base:.2f}% on the {g.name} preset (tool calculation)",
            "chance": "no chance level (a parameter count)", "n": 1, "n_label": "preset",
            "reading": f"W_Q parameters / non-embedding parameters of {g.name} ({g.source}). Stored checkpoints "
                       "do not record their vocabulary, so this is computed on the preset only."}


def _attn_scale(claim: Claim, data: Inputs) -> dict:
    ck = data.checkpoints.dropna(subset=["attn_scale", "d_head"])
    if ck.empty:
        return {"measured": None, "reading": "No stored checkpoint records its attention scale."}
    ck = ck.assign(rel=ck["attn_scale"].astype(float) * np.sqrt(ck["d_head"].astype(float)))
    parts = [f"{v}: {', '.join(f'{x:g}' for x in sorted(g['rel'].round(4).unique()))}"
             for v, g in ck.groupby("variant")]
    return {"measured": "scale x sqrt(d_head) by variant: " + "; ".join(parts),
            "chance": "no chance level (a setting)", "n": int(len(ck)), "n_label": "checkpoints",
            "reading": "0.5 is the paper's query-free setting, 1 the usual 1/sqrt(d_head)."}


def _weight_decays(claim: Claim, data: Inputs) -> dict:
    runs = data.runs[data.runs["weight_decay"].notna()]
    if runs.empty:
        return {"measured": None, "reading": "No run with a weight decay recorded."}
    parts = [f"{v}: {', '.join(f'{w:g}' for w in sorted(g['weight_decay'].astype(float).unique()))}"
             for v, g in runs.groupby("variant")]
    return {"measured": "weight decays by variant: " + "; ".join(parts),
            "chance": "no chance level (a setting)", "n": int(len(runs)), "n_label": "runs", "reading": ""}


def _mlp_ratio(claim: Claim, data: Inputs) -> dict:
    runs = data.runs[data.runs["mlp_ratio"].notna()] if "mlp_ratio" in data.runs else data.runs.iloc[:0]
    if runs.empty:
        return {"measured": None, "reading": "No run records an MLP ratio in its config."}
    parts = [f"{v}: {', '.join(f'{m:g}' for m in sorted(g['mlp_ratio'].astype(float).unique()))}"
             for v, g in runs.groupby("variant")]
    return {"measured": "MLP ratio by variant: " + "; ".join(parts), "chance": "no chance level (a setting)",
            "n": int(len(runs)), "n_label": "runs",
            "reading": "Train the comparison with `python -m app train --mlp-ratio 4.5` (query-free) and 3.5 (qkv)."}


def _wd_stability(claim: Claim, data: Inputs) -> dict:
    runs = data.runs[data.runs["weight_decay"].notna()]
    if runs.empty:
        return {"measured": None, "reading": "No run with a weight decay recorded."}
    table = wd_sensitivity(runs[["run_id", "variant", "weight_decay", "config"]], data.points)
    if table.empty:
        return {"measured": None, "reading": f"No run with a weight decay logged {data.loss_metric}."}
    rel = relative_stability(table, claim.match["variant"], "qkv")
    parts = []
    for side in (rel["a"], rel["b"]):
        if not side["n_runs"]:
            parts.append(f"{side['variant']}: no runs")
            continue
        best = side["best_weight_decay"]
        ci = ""
        if side["best_wd_ci_low"] is not None and side["best_wd_ci_high"] is not None:
            ci = f" (95% {side['best_wd_ci_low']:g} to {side['best_wd_ci_high']:g})"
        stable = ", ".join(f"{w:g}" for w in side["stable_weight_decays"]) or "none"
        parts.append(f"{side['variant']} [{side['group']}]: best wd "
                     + (f"{best:g}{ci}" if best is not None else "n/a")
                     + f", stable at wd {stable}")
    ratio = rel["best_wd_ratio"]
    if ratio is not None:
        parts.append(f"best-wd ratio qkv / {claim.match['variant']} {ratio:.3g}")
    n = rel["a"]["n_runs"] + rel["b"]["n_runs"]
    reading = ("analysis.wd_sensitivity.relative_stability (the Weight decay page's statistics): stable = no run at "
               "that weight decay diverged or spiked; the paper's 3.2 is qkv's 0.1 over the query-free 0.03125.")
    if rel["ratio_reason"]:
        reading += f" No ratio: {rel['ratio_reason']}."
    return {"measured": "; ".join(parts), "chance": "no chance level (stability and best wd)", "n": n,
            "n_label": "runs", "reading": reading}


_UNIT_WORDS = {"token": "per token", "byte": "per byte", "?": "unit unknown"}


def _group_text(r) -> str:
    return f"project {r['project']}, {geometry_label(r)}"


def _relative_loss(claim: Claim, data: Inputs) -> dict:
    rel = relative_losses(data.runs)
    variant, kind = claim.match["variant"], claim.match["sharing"]
    same_variant = rel[rel["variant"] == variant] if not rel.empty else rel
    hit = same_variant[same_variant["sharing"] == kind]
    if hit.empty:
        other = sorted(set(same_variant["sharing"]))
        return {"measured": None, "reading": f"No {variant} {kind} runs beside qkv MHA runs of their own project and "
                                             f"geometry at the same weight decay."
                + (f" Runs of {variant} with {', '.join(other)} exist: another head-sharing class than the "
                   f"claim's {kind}, so not compared." if other else "")}
    # one group's runs (per token first, then the one with most runs; the others are named): never a
    # mean across projects, geometries or units
    hit = hit.assign(_token=hit["loss_unit"] != "token").sort_values(["_token", "n_runs"], ascending=[True, False],
                                                                      kind="stable")
    r = hit.iloc[0]
    others = "" if len(hit) == 1 else " Other groups: " + "; ".join(
        f"{_group_text(o)}: {_pct(o['rel_ppl'], 2)} {_UNIT_WORDS[o['loss_unit']]}" for o in hit.iloc[1:].to_dict("records")) + "."
    wds = ", ".join("?" if w is None else f"{w:g}" for w in r["weight_decays"])
    spread = r["seed_spread_ppl"]
    change = f"{_pct(r['rel_ppl'], 2)} perplexity {_UNIT_WORDS[r['loss_unit']]}"
    if r["loss_unit"] == "token":
        measured = f"{change} ({_pct(r['rel_loss'], 2)} final {data.loss_metric})"
        caveat = ""
    else:
        measured = f"{change}: not compared ({_pct(r['rel_loss'], 2)} final {data.loss_metric})"
        caveat = (" The paper's perplexity is per token; a per-byte loss (a byte-level model) or one of unknown "
                  "unit is a different quantity, so the two are not set against each other.")
    return {"measured": measured,
            "chance": "no chance level; seed spread of qkv " + (_pct(spread, 2) if not pd.isna(spread) else "unknown "
                                                                "(one run per weight decay)"),
            "n": int(r["n_runs"]), "n_label": f"runs (+{int(r['n_base'])} qkv)",
            "reading": f"{_upper_first(_group_text(r))} ({kind}), against qkv MHA runs of the same project and "
                       f"geometry; the paper's model: {claim.model}. Mean over weight decays {wds}; perplexity = "
                       f"exp(loss), so the change is exp(loss_v - loss_qkv) - 1.{caveat}{others}"}


def _kv_saving(claim: Claim, data: Inputs) -> dict:
    preset = PRESETS[claim.match["preset"]]
    frac = claim.match.get("kv_frac")
    nkv = 1 if claim.match["sharing"] == "MQA" else max(1, int(preset.n_heads * frac))
    tool = kv_saving(preset, claim.match["variant"], nkv)
    parts = [f"tool calculator on {preset.name}: {100 * tool:.3f}%"]
    ck = data.checkpoints.assign(sharing=[sharing(h, k) for h, k in zip(data.checkpoints["n_heads"],
                                                                         data.checkpoints["n_kv_heads"])])
    mine = ck[(ck["variant"] == claim.match["variant"]) & (ck["sharing"] == claim.match["sharing"])]
    seen = set()
    for _, r in mine.iterrows():
        g = _geometry(r)
        if g is None or (g.n_heads, g.n_kv_heads) in seen:
            continue
        seen.add((g.n_heads, g.n_kv_heads))
        parts.append(f"your {VARIANT_LABELS[claim.match['variant']]} with {g.n_kv_heads} of {g.n_heads} KV heads: "
                     f"{100 * kv_saving(g, claim.match['variant'], g.n_kv_heads):.2f}%")
    return {"measured": "; ".join(parts), "chance": "no chance level (cache bytes)", "n": int(len(mine)),
            "n_label": "checkpoints",
            "reading": "Against separate K and V with every head cached (analysis.kv_cost)."}


def _kv_ratio(claim: Claim, data: Inputs) -> dict:
    g = PRESETS[claim.match["preset"]]
    base = kv_bytes_per_token(g, Attention("qkv", g.n_heads), "bf16")
    tied = kv_bytes_per_token(g, Attention(claim.match["variant"], 1), "bf16")
    ratio = base / tied
    return {"measured": f"{ratio:g}x on {g.name} (tool calculator); {ratio:g} x 2^20 / 10^6 = "
                        f"{ratio * 2 ** 20 / 1e6:.1f}", "chance": "no chance level (cache bytes)", "n": 1,
            "n_label": "preset", "reading": claim.note + "."}


def _kv_per_user(claim: Claim, data: Inputs) -> dict:
    """One user's cache at the claim's context on the claim's preset (``analysis.kv_cost``), QKV MHA
    and the claim's configuration, in GB and in MiB."""
    g = PRESETS[claim.match["preset"]]
    context = claim.match["context"]
    nkv = 1 if claim.match["sharing"] == "MQA" else g.n_heads
    base = kv_bytes_per_user(g, Attention("qkv", g.n_heads), context, "bf16")
    tied = kv_bytes_per_user(g, Attention(claim.match["variant"], nkv), context, "bf16")
    return {"measured": f"tool calculator on {g.name}, bf16, {context:,} tokens: QKV {base / GB:.2f} GB "
                        f"({base / GIB:.2f} GiB) -> {VARIANT_LABELS[claim.match['variant']]} with {nkv} KV head "
                        f"{tied / 1e6:.1f} MB ({tied / 2 ** 20:.1f} MiB); {base / tied:g}x",
            "chance": "no chance level (cache bytes)", "n": 1, "n_label": "preset",
            "reading": claim.note + f"; in one unit the cut is {base / GB:.2f} GB -> {tied / 1e6:.1f} MB."}


def _kv_projection(claim: Claim, data: Inputs) -> dict:
    return _geometry_share(data, "wv_share", "K=V removes ", claim.note + ".")


_MEASURES = {
    "kv_similarity": _kv_similarity, "kv_layer_cka": _kv_layer, "kv_layer_cosine": _kv_layer,
    "kv_erank": _kv_erank, "query_free_saving": _query_free,
    "query_free_nonembedding": _query_free_nonembedding, "attn_scale": _attn_scale,
    "weight_decays": _weight_decays, "mlp_ratio": _mlp_ratio, "wd_stability": _wd_stability,
    "relative_loss": _relative_loss, "kv_saving": _kv_saving, "kv_ratio": _kv_ratio,
    "kv_projection_saving": _kv_projection, "kv_per_user": _kv_per_user,
    "not_measured": lambda claim, data: {"measured": None, "reading": claim.note + "."},
}


def measure(data: Inputs, claims=CLAIMS) -> pd.DataFrame:
    """One row per claim (``TABLE_COLUMNS``): the paper's number and what ``data`` reads for it.

    ``measured`` is None where the database has nothing to measure it on (``reading`` says why);
    ``chance`` is the chance level (or why there is none, or "chance not computed yet" where stored
    results predate chance levels); ``n`` how many heads, runs or checkpoints stand behind it.
    """
    rows = []
    for claim in claims:
        fn = _MEASURES.get(claim.measure)
        if fn is None:
            raise AnalysisError(f"claim {claim.key!r}: unknown measurement {claim.measure!r}; "
                                f"expected one of {', '.join(sorted(_MEASURES))}")
        got = fn(claim, data)
        n = got.get("n")
        rows.append({"key": claim.key, "paper": f"{PAPERS[claim.arxiv]['short']} (arXiv {claim.arxiv})",
                     "claim": claim.claim, "model": claim.model, "paper_value": f"{claim.value:.4g}",
                     "units": claim.units,
                     "where": claim.where, "measured": got.get("measured"), "chance": got.get("chance", ""),
                     "n": f"{n} {got.get('n_label', '')}".strip() if n else "",
                     "reading": got.get("reading", ""), "source": claim.arxiv})
    out = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    out["measured"] = out["measured"].astype(object).where(out["measured"].notna(), None)
    return out
