"""Spectra of the weights: four rank summaries of W_Q, W_K, W_V, W_O and M_h per head (formulas:
``analysis.spectra``, ``analysis._linalg.spectrum_stats``); fewer directions used = more redundant.

Chance: Monte Carlo (the median of random Gaussian layers of the same shapes; ``analysis.chance``).
Per-layer values (``head`` empty) exist for the stacked W_K and W_V of grouped-query models (their
stacked matrix is at most half as wide as W_Q's); for W_Q, W_O and the K and V of full multi-head
models the note says why they are absent.
"""
from __future__ import annotations

from analysis.registry import Metric, Values, register

_MC = "median of random Gaussian layers of the same shapes (over draws and heads)"
#: The matrices: axis, what it is, the projections it reads.
MATRICES = {
    "q": ("head", "W_Q[h] (d_model x d_head)", ("Q",)),
    "k": ("kv_head", "W_K[g] (d_model x d_head; head empty: the layer's stacked W_K, "
                     "d_model x n_kv_heads*d_head, grouped-query models only)", ("K",)),
    "v": ("kv_head", "W_V[g] (d_model x d_head; head empty: the layer's stacked W_V, "
                     "d_model x n_kv_heads*d_head, grouped-query models only)", ("V",)),
    "o": ("head", "W_O[h] (d_head x d_model)", ("O",)),
    "qk": ("head", "M_h = W_Q[h] W_K[g(h)]^T", ("Q", "K")),
}
#: The statistics, with their help texts (``{}``: the matrix).
STATS = {
    "erank": "effective rank (Roy & Vetterli 2007) of {}: exp of the entropy of sigma_i / sum sigma",
    "stable_rank": "stable rank ||A||_F^2 / ||A||_2^2 of {}",
    "energy_rank90": "fewest singular values of {} holding 90% of sum sigma_i^2",
    "energy_rank99": "fewest singular values of {} holding 99% of sum sigma_i^2",
}


def _layer_note(what: str, width: int, d_model: int) -> str:
    return (f"{what}: per head only; the per-layer value needs the full spectrum of the layer's stacked "
            f"{d_model} x {width} matrix, an O(d_model^3) eigen-decomposition per layer that the default "
            f"analysis leaves out")


def _compute(stat: str, p: str):
    name = f"{stat}_{p}"

    def compute(layer, meta, device):
        if p == "qk":
            layer.need_qk()
            return layer.qk_spectra[stat]
        if p == "q":
            layer.need_q()
        h, g, d, e = meta.n_heads, meta.n_kv_heads, meta.d_model, meta.d_head
        whole = None
        if p in ("k", "v") and g < h:
            whole = layer.layer_spectra(p)[stat] if layer.whole else None
        else:
            width = (g if p in ("k", "v") else h) * e
            layer.notes[name] = _layer_note(f"W_{p.upper()}", width, d)
        return Values(layer.head_spectra(p)[stat] if layer.heads else None, whole)

    compute.__name__ = compute.__qualname__ = name
    return compute


for _p, (_axis, _what, _reads) in MATRICES.items():
    for _stat, _help in STATS.items():
        register(Metric(f"{_stat}_{_p}", "weights", _axis, "spectra", _help.format(_what), "min", "monte_carlo",
                        _MC, reads=_reads, fixed_by=("q_identity",) if _p == "q" else ()),
                 _compute(_stat, _p))
