"""Chance levels of the weight metrics: closed forms against Monte Carlo, the result-row contract,
determinism, query-free and grouped-query shapes, and random layers reading near their chance."""
from __future__ import annotations

import math
import re
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from analysis import chance, registry
from analysis.chance import attach_weight_chance, weight_chance
from analysis.errors import AnalysisError
from analysis.layer import AttentionWeights
from analysis.registry import COLUMNS, RESULT_COLUMNS
from analysis.weights import weight_metrics
from tests.analysis._threads import one_thread  # noqa: F401  (autouse: one torch thread)


def meta(h=4, g=4, d=32, e=8, norm="layernorm", variant="qkv"):
    return SimpleNamespace(n_heads=h, n_kv_heads=g, d_model=d, d_head=e, norm=norm, variant=variant)


def gen(seed):
    return torch.Generator().manual_seed(seed)


def random_layers(m, n, *, seed, query_free=False):
    g = gen(seed)
    return [chance.random_layer(m, query_free=query_free, generator=g) for _ in range(n)]


def pooled(m, n, *, seed, query_free=False):
    """weight_metrics of ``n`` random layers, concatenated, with a ``whole`` column."""
    frames = [weight_metrics(lay, m, device="cpu")[0] for lay in random_layers(m, n, seed=seed,
                                                                               query_free=query_free)]
    df = pd.concat(frames, ignore_index=True)
    df["whole"] = df["head"].isna()
    return df


def table(m, query_free=False, **kw):
    return weight_chance(m, query_free=query_free, device="cpu", **kw).set_index(["metric", "whole"])


# -- the documentation table -----------------------------------------------------------------
def test_every_weight_metric_has_a_chance_definition():
    assert set(chance.WEIGHT_CHANCE) == set(registry.names("weights"))
    assert all(isinstance(v, str) and v for v in chance.WEIGHT_CHANCE.values())


# -- closed forms against Monte Carlo (float64, straight from the definitions) ----------------
def test_kv_share_r2_chance_is_d_head_over_d_model():
    d, e, n = 32, 8, 3000
    k = torch.randn(n, d, e, generator=gen(1), dtype=torch.float64)
    v = torch.randn(n, d, e, generator=gen(2), dtype=torch.float64)
    t = torch.linalg.lstsq(k, v).solution                          # [n, e, e]
    r2 = 1 - (v - k @ t).square().sum((1, 2)) / v.square().sum((1, 2))
    assert float(r2.mean()) == pytest.approx(e / d, rel=0.02)
    assert float(r2.median()) == pytest.approx(e / d, rel=0.02)
    assert table(meta(d=d, e=e)).loc[("kv_share_r2", False), "chance"] == pytest.approx(e / d)
    assert table(meta(h=8, g=2, d=64, e=8)).loc[("kv_share_r2", False), "chance"] == pytest.approx(0.125)


def test_kv_share_r2_through_weight_metrics_averages_d_head_over_d_model():
    df = pooled(meta(h=8, g=8, d=32, e=8), 20, seed=3)
    r2 = df.loc[df["metric"] == "kv_share_r2", "value"]
    assert len(r2) == 160
    assert r2.mean() == pytest.approx(0.25, rel=0.03)


def test_kv_cosine_flat_chance_is_zero():
    d, e, n = 32, 8, 4000
    k = torch.randn(n, d * e, generator=gen(4), dtype=torch.float64)
    v = torch.randn(n, d * e, generator=gen(5), dtype=torch.float64)
    cos = (k * v).sum(1) / (k.norm(dim=1) * v.norm(dim=1))
    se = float(cos.std()) / math.sqrt(n)
    assert abs(float(cos.mean())) < 4 * se
    assert table(meta()).loc[("kv_cosine_flat", False), "chance"] == 0.0


def _symmetry(m):                                                  # float64 reference on materialised M
    return ((m + m.mT) / 2).square().sum((1, 2)) / m.square().sum((1, 2))


def test_qk_symmetry_chance_is_one_half_plus_one_over_two_d_model():
    """tr(M^2) is even in Q: random Q, K read (1 + 1/d)/2, not 1/2; query-free (identity Q) too."""
    d, e, n = 16, 4, 20000
    q = torch.randn(n, d, e, generator=gen(6), dtype=torch.float64)
    k = torch.randn(n, d, e, generator=gen(7), dtype=torch.float64)
    want = (1 + 1 / d) / 2
    s = _symmetry(q @ k.mT)
    se = float(s.std()) / math.sqrt(n)
    assert abs(float(s.mean()) - want) < 4 * se
    assert abs(float(s.median()) - want) < 2e-3                     # 1.4e-3 with 2e5 draws
    assert float(s.mean()) - 0.5 > 40 * se                            # the 1/(2d) offset is real
    # query-free: head 1's identity slice E_1 = columns e..2e of the identity
    eye = torch.eye(d, dtype=torch.float64)[:, e:2 * e]             # [d, e]
    s_qf = _symmetry(eye @ k.mT)
    assert abs(float(s_qf.mean()) - want) < 4 * float(s_qf.std()) / math.sqrt(n)
    # per layer, grouped queries: M = sum_h Q_h K_{g(h)}^T, random and query-free
    h, g = d // e, 2
    ks = torch.randn(n, g, d, e, generator=gen(8), dtype=torch.float64)
    qs = torch.randn(n, h, d, e, generator=gen(9), dtype=torch.float64)
    for q_of in (lambda i: qs[:, i], lambda i: torch.eye(d, dtype=torch.float64)[:, i * e:(i + 1) * e]):
        m = sum(q_of(i) @ ks[:, i // (h // g)].mT for i in range(h))
        s_layer = _symmetry(m)
        assert abs(float(s_layer.mean()) - want) < max(4 * float(s_layer.std()) / math.sqrt(n), 1e-3)
    # the tables give it, per head and per layer, random and query-free (d_model 64: the shape
    # test_monte_carlo_medians... draws, so one process draws it once)
    for query_free in (True, False):
        t = table(meta(h=4, g=2, d=64, e=16), query_free=query_free)
        assert t.loc[("qk_symmetry", False), "chance"] == pytest.approx((1 + 1 / 64) / 2)
        assert t.loc[("qk_symmetry", True), "chance"] == pytest.approx((1 + 1 / 64) / 2)


def test_qk_directionality_is_odd_under_swapping_q_and_k_and_its_chance_is_zero():
    m = meta(h=4, g=4, d=32, e=8)
    signs, values = [], []
    for lay in random_layers(m, 12, seed=9):
        d_qk = weight_metrics(lay, m, device="cpu")[0].set_index("metric").loc["qk_directionality", "value"]
        swapped = AttentionWeights(0, lay.W_K, lay.W_Q, lay.W_V, lay.W_O)   # M -> M^T
        d_kq = weight_metrics(swapped, m, device="cpu")[0].set_index("metric").loc["qk_directionality", "value"]
        assert d_kq == pytest.approx(-d_qk, abs=1e-6)
        values.append(d_qk)
        signs.append(np.sign(d_qk))
    assert sum(s > 0 for s in signs) >= 2 and sum(s < 0 for s in signs) >= 2   # both signs occur
    assert table(m).loc[("qk_directionality", True), "chance"] == 0.0
    # a query-free full multi-head layer: M = Ks^T, a square Gaussian matrix: also 0
    qf = pooled(m, 16, seed=10, query_free=True)
    vals = qf.loc[qf["metric"] == "qk_directionality", "value"]
    assert abs(vals.median()) < 0.2 and (vals > 0).any() and (vals < 0).any()
    assert table(m, query_free=True).loc[("qk_directionality", True), "chance"] == 0.0


def test_square_condition_median_matches_monte_carlo():
    for d, n in ((32, 8000), (64, 4000)):
        a = torch.randn(n, d, d, generator=gen(d), dtype=torch.float64)
        sv = torch.linalg.svdvals(a)
        kappa = sv[:, 0] / sv[:, -1]
        # the median of n draws scatters by ~1.2/sqrt(n) relative
        assert chance.square_condition_median(d) == pytest.approx(float(kappa.median()), rel=0.05)
    assert chance.square_condition_median(768) / 768 == pytest.approx(3.67, abs=0.03)


def test_square_orth_defect_mean_matches_monte_carlo():
    for d, n in ((16, 20000), (48, 6000)):
        a = torch.randn(n, d, d, generator=gen(100 + d), dtype=torch.float64)
        _, logdet = torch.linalg.slogdet(a)
        defect = torch.log(a.square().sum((1, 2)) / d) - 2 * logdet / d
        se = float(defect.std()) / math.sqrt(n)
        assert chance.square_orth_defect_mean(d) == pytest.approx(float(defect.mean()), abs=4 * se)
        assert abs(float(defect.median()) - float(defect.mean())) < 0.4 / d + 4 * se


def test_wq_closed_forms_agree_with_weight_metrics_on_random_layers():
    m = meta(h=4, g=4, d=32, e=8)
    df = pooled(m, 40, seed=11)
    t = table(m)
    cond = df.loc[df["metric"] == "wq_condition", "value"]
    assert t.loc[("wq_condition", True), "how"].startswith("closed form; band of ")
    # heavy-tailed: the median of 40 draws scatters by ~20%; the quartiles bracket it
    assert cond.quantile(0.25) < t.loc[("wq_condition", True), "chance"] < cond.quantile(0.75)
    defect = df.loc[df["metric"] == "wq_basis_orth_defect", "value"]
    assert t.loc[("wq_basis_orth_defect", True), "chance"] == pytest.approx(defect.mean(), abs=0.05)


# -- random layers read near their chance level ------------------------------------------------
@pytest.mark.parametrize("shape", [dict(h=4, g=4, d=32, e=8), dict(h=8, g=2, d=64, e=8),
                                   dict(h=4, g=1, d=64, e=16, norm="none")])
def test_random_layers_read_near_their_chance_level(shape):
    m = meta(**shape)
    t = weight_chance(m, query_free=False, device="cpu")
    df = pooled(m, 12, seed=1234)                                   # other draws than the chance's
    for metric, whole, ch, how, *_band in t.itertuples(index=False):
        values = df.loc[(df["metric"] == metric) & (df["whole"] == whole), "value"]
        assert len(values), (metric, whole)
        if metric.startswith("norm_"):
            assert math.isnan(ch) and how == "none" and registry.BY_NAME[metric].chance == "none"
            assert "scale" in chance.WEIGHT_CHANCE[metric]
            continue
        # per head: inside the central 90%; per layer (12 values; qk_directionality of random layers
        # spreads over [-1, 1] at these sizes): inside their range
        lo, hi = (values.min(), values.max()) if whole else (values.quantile(0.05), values.quantile(0.95))
        assert lo - 1e-9 <= ch <= hi + 1e-9, (metric, whole, lo, ch, hi)


def test_kv_cka_of_independent_random_k_and_v_reads_chance_and_a_tied_pair_does_not():
    """Known answer: a layer whose K and V are independent random reads kv_cka near chance,
    whatever its other projections; one whose V is K reads 1."""
    m = meta(h=8, g=8, d=64, e=16)
    t = table(m)
    q = torch.zeros(8, 64, 16)
    q[:, :16, :] = torch.randn(8, 16, 16, generator=gen(20))        # a structured, low-rank W_Q
    layers = random_layers(m, 8, seed=21)
    cka = []
    for lay in layers:
        structured = AttentionWeights(0, q, lay.W_K, lay.W_V, lay.W_O)
        df = weight_metrics(structured, m, device="cpu")[0]
        cka += df.loc[df["metric"] == "kv_cka", "value"].tolist()
    cka = np.array(cka)                                             # 64 heads; the chance: 32
    se = 1.25 * cka.std() * math.sqrt(1 / len(cka) + 1 / 32)        # of the difference of two medians
    assert abs(np.median(cka) - t.loc[("kv_cka", False), "chance"]) < 4 * se
    # and the ratio of the expectations, d_head / (d_model + d_head + 1), is close to it
    assert t.loc[("kv_cka", False), "chance"] == pytest.approx(16 / (64 + 16 + 1), rel=0.05)
    tied = AttentionWeights(0, q, layers[0].W_K, layers[0].W_K, layers[0].W_O)
    df = weight_metrics(tied, m, device="cpu")[0]
    assert df.loc[df["metric"] == "kv_cka", "value"].min() == pytest.approx(1.0, abs=1e-5)


# -- the result rows -------------------------------------------------------------------------
def _checkpoint_frame(m, n_layers=3, *, seed=30, query_free=False):
    frames = []
    for i, lay in enumerate(random_layers(m, n_layers, seed=seed, query_free=query_free)):
        frames.append(weight_metrics(AttentionWeights(i, lay.W_Q, lay.W_K, lay.W_V, lay.W_O), m,
                                     device="cpu")[0])
    return pd.concat(frames, ignore_index=True)


@pytest.mark.parametrize("shape, query_free", [(dict(h=4, g=4, d=32, e=8), False),
                                               (dict(h=8, g=2, d=64, e=8), False),
                                               (dict(h=4, g=2, d=64, e=16), True),
                                               (dict(h=4, g=4, d=32, e=8, norm="none"), False)])
def test_attach_weight_chance_fills_every_row_that_has_a_chance(shape, query_free):
    m = meta(**shape)
    frame = _checkpoint_frame(m, query_free=query_free)
    before = frame.copy()
    out = attach_weight_chance(frame, m, query_free=query_free, device="cpu")
    pd.testing.assert_frame_equal(frame, before)                     # input untouched
    assert list(out.columns) == RESULT_COLUMNS + ["p_null"]
    pd.testing.assert_frame_equal(out[COLUMNS], frame[COLUMNS])
    # the null band holds the chance level, and a random layer's values get moderate p-values
    has = out["chance"].notna()
    assert (out.loc[has, "chance_low"] <= out.loc[has, "chance"] + 1e-12).all()
    assert (out.loc[has, "chance"] <= out.loc[has, "chance_high"] + 1e-12).all()
    assert out["above_chance"].isna().all() and not out["degenerate"].any()
    norms = out["metric"].str.startswith("norm_")
    assert out.loc[~norms, "chance"].notna().all()
    assert out.loc[norms, "chance"].isna().all()
    assert out["n_tokens"].dtype == "Int64" and out["n_tokens"].isna().all()
    assert out["ci_low"].isna().all() and out["ci_high"].isna().all()
    assert out["chance"].dtype == "float64"
    # one chance per (metric, whole), the same on every layer
    per_key = out.assign(whole=out["head"].isna()).groupby(["metric", "whole"])["chance"].nunique(dropna=False)
    assert (per_key == 1).all()
    t = table(m, query_free=query_free)
    row = out[(out["metric"] == "kv_share_r2")].iloc[0]
    assert row["chance"] == t.loc[("kv_share_r2", False), "chance"]


def test_attach_weight_chance_tells_apart_head_and_layer_rows():
    m = meta(h=8, g=2, d=64, e=8)
    out = attach_weight_chance(_checkpoint_frame(m, 1), m, query_free=False, device="cpu")
    er = out[out["metric"] == "erank_k"]
    head_ch = er.loc[er["head"].notna(), "chance"].unique()
    layer_ch = er.loc[er["head"].isna(), "chance"].unique()
    assert len(head_ch) == 1 and len(layer_ch) == 1
    assert head_ch[0] < 8 < layer_ch[0] <= 16                         # one head's d_head vs the stack's 2 d_head


def test_attach_weight_chance_names_missing_columns():
    frame = pd.DataFrame({"layer": [0], "metric": ["kv_cka"], "value": [0.1]})
    with pytest.raises(AnalysisError) as err:
        attach_weight_chance(frame, meta(), query_free=False, device="cpu")
    assert str(err.value) == ("attach_weight_chance: expected a frame with columns "
                              "['layer', 'head', 'head_label', 'metric', 'value'], missing ['head', 'head_label']")


def test_attach_weight_chance_of_an_empty_frame():
    out = attach_weight_chance(pd.DataFrame(columns=COLUMNS), meta(), query_free=False, device="cpu")
    assert list(out.columns) == RESULT_COLUMNS + ["p_null"] and len(out) == 0


# -- determinism, caching ----------------------------------------------------------------------
def _uncached(m, *, seed: int = 0) -> tuple:
    """``weight_chance``'s rows for ``m`` drawn now, whatever the process's cache or the disk store
    (``chance.use_store``) holds."""
    return chance._draw_rows(m.n_heads, m.n_kv_heads, m.d_model, m.d_head, m.norm, False, "cpu", seed)


def test_chance_is_deterministic_for_a_seed_and_cached():
    m = meta(h=4, g=4, d=32, e=8)
    a = weight_chance(m, query_free=False, device="cpu", seed=5)
    hits = chance._chance_rows.cache_info().hits
    b = weight_chance(m, query_free=False, device="cpu", seed=5)
    assert chance._chance_rows.cache_info().hits == hits + 1
    pd.testing.assert_frame_equal(a, b)
    b.loc[0, "chance"] = -1.0                                         # callers get their own copy
    pd.testing.assert_frame_equal(a, weight_chance(m, query_free=False, device="cpu", seed=5))
    # drawn again past the cache (clearing it would make the other tests of this process draw again)
    fresh = _uncached(m, seed=5)
    pd.testing.assert_frame_equal(a, pd.DataFrame(list(fresh), columns=a.columns))
    other = weight_chance(m, query_free=False, device="cpu", seed=0)          # drawn by the tests above
    closed = a["how"].str.startswith("closed form")
    pd.testing.assert_series_equal(a.loc[closed, "chance"], other.loc[closed, "chance"])
    mc = a["how"].str.startswith("median")
    assert (a.loc[mc, "chance"] != other.loc[mc, "chance"]).any()
    # a different norm is another key (and another set of metrics)
    none = weight_chance(meta(h=4, g=4, d=32, e=8, norm="none"), query_free=False, device="cpu", seed=0)
    assert "wq_absorb_error" in set(none["metric"]) and "wq_absorb_error" not in set(a["metric"])


def test_draws_and_how():
    t = table(meta(h=8, g=2, d=64, e=8))
    how = t.loc[("kv_cka", False), "how"]
    drawn = int(how.split()[2])
    assert 2 * chance.MIN_DRAWS <= drawn <= chance.MAX_HEAD_SAMPLES + chance.WIDE_HEADS
    assert how == f"median of {drawn} Gaussian heads" == f"median of {len(t.loc[('kv_cka', False), 'null'])} Gaussian heads"
    assert t.loc[("erank_q", False), "how"].endswith(" Gaussian heads")
    assert t.loc[("erank_k", True), "how"].startswith("median of ") and "Gaussian draws" in t.loc[("erank_k", True), "how"]
    assert t.loc[("kv_share_r2", False), "how"].startswith("closed form; band of ")
    assert t.loc[("norm_q", True), "how"] == "none"
    assert math.isnan(t.loc[("norm_q", True), "chance"])


def test_median_se_and_stable_on_known_samples():
    """The median's standard error from its order statistics, and the 1% rule, on known samples."""
    x = torch.arange(100, dtype=torch.float64)             # ranks 45 and 55: (55 - 45) / 2
    assert chance.median_se(x) == 5.0
    assert chance.median_se(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)) == math.inf
    # a normal sample of 40,000 around 10 with sd 1: SE ~ 1.2533 / 200 = 0.0063 <= 0.0036 x 10
    z = torch.randn(40_000, generator=gen(3), dtype=torch.float64).sort().values
    assert chance.median_se(z + 10) == pytest.approx(1.2533 / 200, rel=0.15)
    assert chance.stable(z + 10)
    assert not chance.stable(z[::100])                     # 400 draws: SE ~0.063 > 0.0036 x 3.9
    assert chance.stable(torch.full((50,), 3.0, dtype=torch.float64))   # integer-valued: no spread


def test_monte_carlo_medians_are_stable_and_equal_shapes_agree_within_one_percent():
    """The draws stop once each median is stable to 1% (or at MAX_DRAWS, said in ``how``); two
    independent sets of draws of the same shapes (another seed; another variant whose metric does
    not depend on it) then give chance levels within 1% of each other."""
    m = meta(h=4, g=2, d=64, e=16)
    a = table(m, seed=0)
    b = table(m, seed=1)
    q = table(meta(h=4, g=2, d=64, e=16, variant="wq_identity"), query_free=True, seed=0)
    # query-free grouped-query: no closed form for the directionality; its exact draws (many, cheap)
    # put two seeds' medians within 1% of the band's width (-1 to 1) of each other
    q3 = table(meta(h=4, g=2, d=64, e=16, variant="wq_identity"), query_free=True, seed=3)
    for key in [("qk_directionality", True), ("qk_directionality_paper", True)]:
        assert "not stable" not in q.loc[key, "how"] and "not stable" not in q3.loc[key, "how"], key
        width = q.loc[key, "chance_high"] - q.loc[key, "chance_low"]
        assert width == 2.0 and abs(q.loc[key, "chance"]) > 0.3, key       # atoms at -1 and +1; median ~0.43
        assert abs(q3.loc[key, "chance"] - q.loc[key, "chance"]) <= 0.01 * width, key
        assert int(re.search(r"median of (\d+) Gaussian draws", q.loc[key, "how"]).group(1)) > 20_000
    # the paper's scale reads the same draws, negated (each stops once its own median is stable)
    assert q.loc[("qk_directionality_paper", True), "chance"] == pytest.approx(
        -q.loc[("qk_directionality", True), "chance"], abs=0.01)
    for key in [("kv_cka", False), ("erank_k", False), ("erank_v", False), ("stable_rank_o", False),
                ("erank_k", True), ("erank_v", True)]:
        assert "not stable" not in a.loc[key, "how"], (key, a.loc[key, "how"])
        scale = max(abs(a.loc[key, "chance"]), a.loc[key, "chance_high"] - a.loc[key, "chance_low"])
        for other in (b, q):
            assert abs(other.loc[key, "chance"] - a.loc[key, "chance"]) <= 0.01 * scale, key
    # the band: 2.5% and 97.5% of the draws, around the chance level
    lo, ch, hi = (a.loc[("kv_cka", False), c] for c in ("chance_low", "chance", "chance_high"))
    assert lo < ch < hi
    null = a.loc[("kv_cka", False), "null"]
    assert len(null) >= 2 * chance.MIN_DRAWS and list(null) == sorted(null)
    assert lo == pytest.approx(float(np.quantile(null, 0.025)), rel=1e-12)


# -- query-free and grouped-query shapes --------------------------------------------------------
@pytest.mark.parametrize("shape", [dict(h=4, g=2, d=64, e=16), dict(h=8, g=2, d=64, e=8), dict(h=4, g=1, d=32, e=8)])
def test_query_free_directionality_from_the_keys_alone_is_the_layers_score(shape):
    """The exact null sampler of the query-free grouped-query directionality reads the score off
    the stacked K's row and column norms; on the same K it equals what weight_metrics computes."""
    from analysis import qk_geometry
    m = meta(**shape, variant="wq_identity")
    g = gen(60)
    for _ in range(4):
        lay = chance.random_layer(m, query_free=True, generator=g)
        frame = weight_metrics(lay, m, device="cpu")[0].set_index("metric")
        kt = lay.W_K.mT.reshape(m.n_kv_heads * m.d_head, m.d_model)      # the weight's rows
        got = float(qk_geometry.query_free_directionality(kt, m.n_heads // m.n_kv_heads))
        assert got == pytest.approx(frame.loc["qk_directionality", "value"], abs=1e-5)
        assert -got == pytest.approx(frame.loc["qk_directionality_paper", "value"], abs=1e-5)
    # the registry's sampler: only where the closed form does not hold; deterministic per seed and batch
    assert registry.null_draws("qk_directionality", meta(h=4, g=4, d=64, e=16), True, 0, 0) is None
    assert registry.null_draws("qk_directionality", m, False, 0, 0) is None
    a = registry.null_draws("qk_directionality", m, True, 0, 1)
    assert torch.equal(a, qk_geometry.query_free_directionality_null.__wrapped__(
        m.n_heads, m.n_kv_heads, m.d_model, m.d_head, 0, 1))
    assert not torch.equal(a, registry.null_draws("qk_directionality", m, True, 0, 2))
    assert torch.equal(-a, registry.null_draws("qk_directionality_paper", m, True, 0, 1))


def _keys(frame):
    return set(zip(frame["metric"], frame["head"].isna()))


@pytest.mark.parametrize("shape", [dict(h=4, g=4, d=32, e=8), dict(h=4, g=2, d=64, e=16),
                                   dict(h=4, g=2, d=48, e=8)])       # the last: h*e != d, no identity query
def test_query_free_chance_rows_are_the_metrics_weight_metrics_gives(shape):
    m = meta(**shape, variant="wq_identity")
    t = weight_chance(m, query_free=True, device="cpu")
    model = chance.random_layer(m, query_free=True, generator=gen(40))
    assert set(zip(t["metric"], t["whole"])) == _keys(weight_metrics(model, m, device="cpu")[0])
    names = set(t["metric"])
    assert not names & {"erank_q", "stable_rank_q", "norm_q", "wq_condition", "wq_basis_orth_defect",
                        "wq_absorb_error"}
    if shape["h"] * shape["e"] != shape["d"]:
        assert not names & {"qk_symmetry", "qk_directionality", "erank_qk"}
    else:
        assert {"qk_symmetry", "qk_directionality", "erank_qk"} <= names


def test_grouped_query_chance_rows_are_the_metrics_weight_metrics_gives():
    for shape in (dict(h=8, g=2, d=64, e=8), dict(h=4, g=1, d=64, e=16, norm="none"), dict(h=4, g=4, d=48, e=8)):
        m = meta(**shape)
        t = weight_chance(m, query_free=False, device="cpu")
        model = chance.random_layer(m, query_free=False, generator=gen(41))
        assert set(zip(t["metric"], t["whole"])) == _keys(weight_metrics(model, m, device="cpu")[0])
    # non-square stacked W_Q: a Monte Carlo condition number, no orthogonality defect
    t = table(meta(h=4, g=4, d=48, e=8))
    assert t.loc[("wq_condition", True), "how"].startswith("median of ")
    assert ("wq_basis_orth_defect", True) not in t.index


def test_random_layer_shapes_and_independence():
    m = meta(h=8, g=2, d=64, e=8)
    lay = chance.random_layer(m, query_free=False, generator=gen(50))
    assert tuple(lay.W_Q.shape) == (8, 64, 8) and tuple(lay.W_K.shape) == (2, 64, 8)
    assert tuple(lay.W_V.shape) == (2, 64, 8) and tuple(lay.W_O.shape) == (8, 8, 64)
    assert lay.b_Q is None and lay.b_K is None and lay.b_V is None
    assert not torch.equal(lay.W_K, lay.W_V)
    assert chance.random_layer(m, query_free=True, generator=gen(50)).W_Q is None
    again = chance.random_layer(m, query_free=False, generator=gen(50))
    assert torch.equal(lay.W_Q, again.W_Q) and torch.equal(lay.W_O, again.W_O)


# -- the random draws leave out what their closed forms make unneeded ------------------------------
def test_skip_leaves_out_only_the_skipped_metrics():
    m = meta(h=4, g=4, d=32, e=8)
    lay = chance.random_layer(m, query_free=False, generator=gen(50))
    full = weight_metrics(lay, m, device="cpu")[0]
    skip = {"qk_symmetry", "qk_directionality", "wq_condition", "wq_basis_orth_defect"}
    part = weight_metrics(lay, m, device="cpu", skip=skip)[0]
    assert not part["metric"].isin(skip).any() and full["metric"].isin(skip).any()
    kept = full[~full["metric"].isin(skip)].reset_index(drop=True)
    pd.testing.assert_frame_equal(kept, part.reset_index(drop=True))
    with pytest.raises(AnalysisError, match=r"weight_metrics: cannot skip \['nope'\]: not registered weight metrics"):
        weight_metrics(lay, m, device="cpu", skip={"nope"})


def test_draws_past_the_minimum_compute_only_the_unstable_metrics(monkeypatch):
    """The first MIN_DRAWS draws compute every metric (each gets a null band); later ones only the
    Monte Carlo metrics whose median is not yet stable (never a closed-form one), wide ones per head only."""
    asked = []
    real = chance.weight_metrics
    every = {p.metric.name for p in registry.computed("weights")}
    monkeypatch.setattr(chance, "weight_metrics", lambda lay, m, **kw: asked.append(
        (m.n_heads, every - set(kw["skip"]), kw.get("whole", True), kw.get("heads", True))) or real(lay, m, **kw))
    _uncached(meta(h=4, g=4, d=32, e=8))                                          # square: all closed
    assert asked[:chance.MIN_DRAWS] == [(4, every, True, True)] * chance.MIN_DRAWS
    closed = {m.name for m in registry.METRICS if m.chance == "closed"}
    assert all(not (done & closed) for h, done, _, _ in asked[chance.MIN_DRAWS:] if h == 4)
    assert all(not whole for h, _, whole, _ in asked if h == chance.WIDE_HEADS)
    assert all(not heads for h, _, _, heads in asked[chance.MIN_DRAWS:] if h == 4)


# -- every chance level stable to 1%, with its draws said ------------------------------------------
def test_equal_shapes_with_other_seeds_agree_within_one_percent():
    """Two sets of draws (seeds 0 and 1) of one grouped-query shape: every Monte Carlo median within 1%
    of the larger of its magnitude and its null band's width (``chance.stable``), and each says its draws.
    An integer-valued metric (``energy_rank*``) has an integer median, which two seeds may put on either
    side of a value its distribution straddles: those agree within one unit."""
    m = meta(h=4, g=2, d=32, e=8)
    a, b = (weight_chance(m, query_free=False, device="cpu", seed=s) for s in (0, 1))
    assert list(zip(a["metric"], a["whole"])) == list(zip(b["metric"], b["whole"]))
    mc = a["how"].str.startswith("median")
    assert mc.sum() >= 20 and a.loc[mc & a["whole"], "metric"].str.startswith("stable_rank").any()
    for (_, x), (_, y) in zip(a[mc].iterrows(), b[mc].iterrows()):
        scale = max(abs(x["chance"]), x["chance_high"] - x["chance_low"])
        near = 1.0 if x["metric"].startswith("energy_rank") else 0.01 * scale
        assert abs(x["chance"] - y["chance"]) <= near, (x["metric"], x["whole"], x["chance"], y["chance"])
        assert re.match(r"median of \d+ Gaussian (draws|heads)", x["how"]), x["how"]      # the draws said
