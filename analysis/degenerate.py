"""Values fixed by construction: which result rows are ``degenerate`` and why.

A row is degenerate when its value is not a measurement of the trained
projections but follows from the model's structure or from too little data:

* **a tie fixes it** (``tie_fixed``, from ``analysis.tied.tied_layer``):
  K = V makes every K/V similarity 1 (``kv_cosine_flat``, ``kv_cka``,
  ``kv_share_r2`` and their activation forms); Q = K makes ``M = K K^T``
  symmetric, so ``qk_symmetry`` is 1, ``logit_symmetry`` 1,
  ``qk_directionality`` 0 (row and column norms of a symmetric matrix agree)
  and its skew-symmetric part 0 (``energy_qk_skew`` 0, ``erank_qk_skew`` undefined);
  a stored identity W_Q fixes W_Q's spectra (every singular value 1), its
  condition number (1), its orthogonality defect (0) and, the query being a
  slice of the residual stream, ``qk_directionality`` to a property of W_K alone.
* **a matrix is rank-deficient** (``rank_deficient``): some
  ``sigma_i <= RANK_EPS_FACTOR * eps * sigma_max`` with ``eps`` of the *stored*
  dtype (float32 1.2e-7, bfloat16 7.8e-3): a direction below the stored numbers'
  relative rounding, the tolerance at which ``analysis.tied`` calls two
  projections equal (rounding each entry moves the singular values by about
  ``eps * sigma_max``; numpy's ``matrix_rank`` takes ``max(rows, cols) * eps``,
  which in bfloat16 would call a 64 x 16 Gaussian matrix rank-deficient). The K=V share fit regresses V on K's
  columns, so a rank-deficient ``W_K[g]`` leaves it underdetermined (an exactly
  rank-4 K of d_head 16 reads 0.0143 from float32, 0.1254 from bfloat16, 0.1154
  in float64); a singular stacked W_Q has no finite condition number.
* **the sample is too small** (activations, ``analysis.activations``): fewer
  than ``TOKENS_PER_COLUMN x d_head`` tokens, or a captured input that spans no
  more directions than a head has columns (then the K and V caches span the same
  subspace and the share fit reads 1 whatever the weights).

Degenerate rows keep their value; ``analysis.above_chance`` never tests them
and the pages grey them and leave them out of every count.
"""
from __future__ import annotations

import pandas as pd
import torch

from analysis.tied import EPS_FACTOR

#: Singular values below this many machine epsilons (of the stored dtype) of ``sigma_max`` are
#: rounding: ``analysis.tied``'s tolerance.
RANK_EPS_FACTOR = EPS_FACTOR

#: Why a tie (``analysis.tied.tied_layer``'s keys) fixes a value; which metrics it fixes is each
#: metric's declaration (``analysis.registry.Metric.fixed_by``, ``fixed_by_tie``).
TIE_REASONS: dict[str, str] = {
    "k_eq_v": "K = V in this layer: the K/V similarity is 1 by construction",
    "q_eq_k": ("Q = K in this layer: M = W_K W_K^T is symmetric by construction (symmetry 1, directionality 0, "
               "no skew-symmetric part)"),
    "q_identity": ("W_Q is a stored identity slice in this layer: its spectrum, condition number (1) and "
                   "orthogonality defect (0) are fixed, and the directionality is W_K's alone"),
}


def fixed_by_tie(tie: str) -> tuple[str, ...]:
    """The registered metrics whose value ``tie`` fixes (their ``fixed_by``), in registry order."""
    from analysis import registry  # here: the registry's metric modules import this one

    return tuple(m.name for m in registry.METRICS if tie in m.fixed_by)


def stored_eps(*dtypes) -> float:
    """Machine epsilon of the widest-spaced floating dtype among ``dtypes`` (torch dtypes or their
    names, ``"bfloat16"``; anything else counts as float32, the loaders' default)."""
    out = float(torch.finfo(torch.float32).eps)
    for dt in dtypes:
        if isinstance(dt, str):
            dt = getattr(torch, dt.replace("torch.", ""), None)
        if isinstance(dt, torch.dtype) and dt.is_floating_point:
            out = max(out, float(torch.finfo(dt).eps))
    return out


def rank_deficient(sv: torch.Tensor, eps: float) -> torch.Tensor:
    """Per stack entry of singular values ``sv: [..., n]`` (any order): whether some
    ``sigma_i <= RANK_EPS_FACTOR * eps * sigma_max`` (module docstring); an all-zero matrix is
    rank-deficient."""
    top = sv.amax(-1)
    return (sv.amin(-1) <= RANK_EPS_FACTOR * eps * top) | (top <= 0)


def add_note(notes: dict[str, str], metric: str, text: str) -> None:
    """``text`` appended to ``metric``'s note unless it is already there."""
    if text not in notes.get(metric, ""):
        notes[metric] = f"{notes[metric]}; {text}" if metric in notes else text


def mark(frame: pd.DataFrame, rows: pd.Series, metric: str, reason: str, notes: dict[str, str]) -> None:
    """Set ``degenerate`` on ``frame``'s rows selected by the boolean ``rows`` (all of them
    ``metric``'s) and note ``reason`` with the rows' ``head_label``s (up to 8)."""
    if not bool(rows.any()):
        return
    frame.loc[rows, "degenerate"] = True
    if "above_chance" in frame.columns:                 # a value fixed by construction is never tested
        frame.loc[rows, "above_chance"] = pd.NA
    labels = frame.loc[rows, "head_label"].tolist()
    add_note(notes, metric, f"degenerate at {', '.join(labels[:8])}{' ...' if len(labels) > 8 else ''}: {reason}")


def tie_fixed(frame: pd.DataFrame, ties: list[dict], notes: dict[str, str]) -> pd.DataFrame:
    """``frame`` (``analysis.registry.RESULT_COLUMNS``, any layers) with ``degenerate`` set on the
    rows a layer's ties fix (``fixed_by_tie``; ``ties``: one ``tied_layer`` dict per layer) and the
    reasons in ``notes`` (``above_chance`` NA there). Returns a copy."""
    out = frame.copy()
    if "degenerate" not in out.columns:
        out["degenerate"] = False
    out["degenerate"] = out["degenerate"].fillna(False).astype(bool)
    for tie, reason in TIE_REASONS.items():
        layers = {int(t["layer"]) for t in ties if t.get(tie)}
        if not layers:
            continue
        in_layer = out["layer"].isin(layers)
        for m in fixed_by_tie(tie):
            mark(out, in_layer & (out["metric"] == m), m, reason, notes)
    return out
