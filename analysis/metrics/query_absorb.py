"""Query absorbability: how far the stacked W_Q (``d_model x n_heads*d_head``) is from a change of basis a
query-free model could absorb (formulas: ``analysis.query_absorb``).

Closed-form chance levels (a square stacked W_Q, ``h e = d``, is a ``d x d`` Gaussian matrix):

* ``wq_condition``: the median of ``sigma_max / sigma_min``, **sigma_max / sigma_min(median)**
  with ``sigma_max^2 = mu + s * (-1.2686)`` (Johnstone 2001, Ann. Statist. 29:
  ``mu = (sqrt(d-1) + sqrt(d))^2``, ``s = (sqrt(d-1) + sqrt(d)) (1/sqrt(d-1) +
  1/sqrt(d))^{1/3}``, -1.2686 the Tracy-Widom (beta=1) median) and ``sqrt(d) sigma_min``
  at the median of its limit law ``P(sqrt(d) sigma_min <= t) = 1 - exp(-t^2/2 - t)``
  (Edelman 1988, SIAM J. Matrix Anal. Appl. 9), i.e. ``t = sqrt(1 + 2 ln 2) - 1``:
  about ``3.67 d``. Asymptotic: within 2% of the exact median for ``d >= 32``. The
  condition number has no mean (its tail is ``P(kappa / d > x) ~ 2/x``). A non-square
  stack: Monte Carlo.
* ``wq_basis_orth_defect`` (normalised models): the exact mean
  ``E[log(||A||_F^2/d) - (2/d) log|det A|] = psi(d^2/2) - ln d - (1/d) sum_{k=1..d} psi(k/2)``
  (``||A||_F^2 ~ chi^2_{d^2}``; ``|det A|^2 = prod_k chi^2_k``, independent factors, from
  the QR (Bartlett) decomposition; ``E ln chi^2_k = psi(k/2) + ln 2``). About
  ``1 + ln(d) / (2d)``; its median is within ``0.4/d`` of the mean.
* ``wq_absorb_error``: Monte Carlo (the conversion's float32 round-off on random W_Q, W_K).
"""
from __future__ import annotations

import math

from analysis.registry import Absent, Metric, register

_MC = "median of random Gaussian layers of the same shapes (over draws and heads)"
#: Median of the Tracy-Widom distribution for beta = 1 (real matrices).
TW1_MEDIAN = -1.2686
#: Median of ``sqrt(d) sigma_min`` of a ``d x d`` Gaussian matrix as ``d -> inf`` (Edelman 1988).
EDELMAN_MEDIAN = math.sqrt(1 + 2 * math.log(2)) - 1
_SINGULAR = ("degenerate where the stacked W_Q is singular (rank < d_model; rows flagged), e.g. query heads that "
             "repeat a block (Q = K with grouped kv heads): no finite condition number, no change of basis")


def square_condition_median(d: int) -> float:
    """Median condition number of a ``d x d`` standard Gaussian matrix (module docstring):
    ``sigma_max`` at the Tracy-Widom median over ``sigma_min`` at Edelman's limit median."""
    if d < 2:
        return 1.0
    a, b = math.sqrt(d - 1), math.sqrt(d)
    mu, s = (a + b) ** 2, (a + b) * (1 / a + 1 / b) ** (1 / 3)
    sigma_max = math.sqrt(mu + s * TW1_MEDIAN)
    return sigma_max * math.sqrt(d) / EDELMAN_MEDIAN


def square_orth_defect_mean(d: int) -> float:
    """``E[log(||A||_F^2/d) - (2/d) log|det A|]`` for a ``d x d`` standard Gaussian ``A``:
    ``psi(d^2/2) - ln d - (1/d) sum_{k=1..d} psi(k/2)`` (module docstring)."""
    import torch   # here: the registry, which imports this module, stays torch-free

    k = torch.arange(1, d + 1, dtype=torch.float64)
    psi = torch.special.digamma
    return float(psi(torch.tensor(d * d / 2, dtype=torch.float64)) - math.log(d) - psi(k / 2).mean())


def _square(geo, query_free: bool) -> bool:
    return not query_free and geo.n_heads * geo.d_head == geo.d_model


def _not_square(meta) -> str:
    return f"stacked W_Q is {meta.d_model} x {meta.n_heads * meta.d_head}, not square: no identity-query conversion"


def _stacked(layer, name: str):
    """The stacked W_Q's spectrum; a singular one flags ``name``'s row degenerate with the note."""
    from analysis.degenerate import add_note   # here: torch loads where a layer is measured

    st = layer.stacked
    if st.sigma_min == 0:
        layer.degenerate.add((name, None))
        add_note(layer.notes, name, _SINGULAR)
    return st


@register(Metric("wq_condition", "weights", "layer", "query_absorb",
                 "condition number sigma_max/sigma_min of the stacked W_Q (d_model x n_heads*d_head)",
                 "min", "closed", "square stacked W_Q: the median condition number of a d_model x d_model Gaussian "
                                  "matrix, about 3.67 d_model (Edelman 1988, Tracy-Widom edge; closed form); "
                                  f"non-square: {_MC}",
                 reads=("Q",), fixed_by=("q_identity",)),
          closed_form=lambda geo, query_free: square_condition_median(geo.d_model) if _square(geo, query_free)
          else None)
def wq_condition(layer, meta, device):
    layer.need_q()
    return _stacked(layer, "wq_condition").condition


@register(Metric("wq_basis_orth_defect", "weights", "layer", "query_absorb",
                 "normalised models: how far the stacked W_Q (the change of basis a query-free model needs) is "
                 "from a scaled orthogonal matrix, log(arithmetic / geometric mean of sigma_i^2) = "
                 "log(||A||_F^2/n) - (2/n) log|det A|; 0 = absorbable through the norm, inf = singular",
                 "min", "closed", "psi(d^2/2) - ln d - (1/d) sum_k psi(k/2), d = d_model: the exact mean "
                                  "defect of a square Gaussian W_Q, about 1 (closed form)",
                 reads=("Q",), fixed_by=("q_identity",)),
          closed_form=lambda geo, query_free: square_orth_defect_mean(geo.d_model) if _square(geo, query_free)
          else None)
def wq_basis_orth_defect(layer, meta, device):
    layer.need_q()
    if meta.norm == "none":
        raise Absent("no normalisation: any invertible change of basis is absorbable, see wq_absorb_error")
    if meta.n_heads * meta.d_head != meta.d_model:
        raise Absent(_not_square(meta))
    return _stacked(layer, "wq_basis_orth_defect").orth_defect


@register(Metric("wq_absorb_error", "weights", "layer", "query_absorb",
                 "models without normalisation: max |logit error| / max |logit| after converting to identity "
                 "queries", "min", "monte_carlo", f"{_MC}: the conversion's float32 round-off on random W_Q and W_K",
                 reads=("Q", "K")))
def wq_absorb_error(layer, meta, device):
    layer.need_q()
    if meta.norm != "none":
        raise Absent(f"model uses {meta.norm}: the conversion is not exact through the norm, "
                     "see wq_basis_orth_defect")
    if meta.n_heads * meta.d_head != meta.d_model:
        raise Absent(_not_square(meta))
    from analysis import query_absorb   # here: torch loads where a layer is measured

    return query_absorb.absorb_error(layer.q, layer.W_K, layer.b_Q, layer.b_K)
