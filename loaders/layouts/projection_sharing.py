"""Projection-sharing variants (arXiv 2606.04032; code
Brainchip-Inc/Do-Transformers-Need-3-Projections).

Their checkpoints are dicts ``{model_state_dict, model_config, train_config,
step, epoch, tokens_seen[, val_metrics]}`` (``val_metrics`` in
``final_model.pt`` and the released ``qkv_keqv_300m_fineweb_edu.pt``;
intermediate ``checkpoint_step_N.pt`` add ``optimizer_state_dict``, which the
source reader drops; ``transformer_KQV_300M_fineweb.py``, ``hf_model_card_llm``).
The source reader gives ``model_config`` as ``source.config`` and the rest as
``source.extras``. Language models keep their blocks in ``model.h`` (keys
``h.{i}.attn.*``, a ``module.`` DDP prefix already stripped) beside top-level
``wte``, ``wpe``, ``ln_f``; each attention also saves its causal-mask buffer
``h.{i}.attn.bias`` ``[1, 1, P, P]``, not a parameter and not read here. The
synthetic-task encoders (``synthetic_tasks.py``) use ``blocks.{i}.attn.*`` and
store their config under ``config``. Every projection is an ``nn.Linear``
(``x @ W.T + b``, biases with ``use_bias``, default true); the output
projection is ``c_proj`` ``[d_model, n_heads*d_head]``; ``d_head = n_embd //
n_head``, scale ``1/sqrt(d_head)``. ``model_config`` fields (their
``ModelConfig``, ``run_eval.py``): ``vocab_size``, ``n_positions``,
``n_layer``, ``n_head``, ``n_embd``, ``n_kv_groups`` (default 1 for every
variant), ``n_inner``, ``*_pdrop``, ``layer_norm_epsilon``,
``initializer_range``, ``use_bias``, ``tie_word_embeddings``,
``use_flash_attention``.

The repository's language-model files (one per variant and size; the 1.2B
files differ from the 300M ones only in ``ModelConfig`` defaults):

==========================  ===================  ================================  =============
file(s)                     attention modules    what the forward computes         variant
==========================  ===================  ================================  =============
``transformer_KQV_*``       ``c_attn`` (3d)      ``q, k, v = split(n_embd)``       ``qkv``
``transformer_GQA_*``       ``c_q``, ``c_kv``    ``k, v = split(kv*d_head)``       ``qkv``, GQA
                            (2*kv*d_head)
``transformer_MQA_*``       ``c_q``, ``c_kv``    ``k, v = split(d_head)``          ``qkv``, 1 kv
                            (2*d_head)
``transformer_KV_1_*``      ``c_q``, ``c_k``     ``v = k``                         ``k_eq_v``
``transformer_QGQA_*``      ``c_q``, ``c_k``     ``v = k``, kv groups              ``k_eq_v``
                            (kv*d_head)
``transformer_QMQA_*``      ``c_q``, ``c_kv``    ``k = v = c_kv(x)``               ``k_eq_v``, 1 kv
                            (d_head)
``transformer_QK_300_M``    ``c_kv`` (2d)        ``k, v = split(n_embd); q = k``   ``q_eq_k``
``transformer_K_300_M``     ``c_k`` (d)          ``q = k = v``                     ``q_eq_k_eq_v``
==========================  ===================  ================================  =============

Beside them this converter reads ``c_q, c_k, c_v`` (separate, ``qkv``), ``c_k, c_v``
and ``c_qk, c_v`` (``q_eq_k``), a ``c_kv`` alone of at most ``d_model`` rows and
``c_qkv`` (``q_eq_k_eq_v``): the module names of the synthetic-task encoders.

The kv-head count is read from the shapes wherever they fix it (``c_attn`` of
``(n_head + 2*kv)*d_head`` rows, ``c_k``, ``c_qk``, ``c_qkv``). A ``c_kv``'s rows
alone cannot tell packed ``[k; v]`` (2*kv*d_head rows) from one tensor used as K
and V (kv*d_head rows), so ``n_kv_groups`` (or ``n_kv_heads``) decides where it
fits exactly one of the two; otherwise (no count, or their default
``n_kv_groups=1``, which MHA configs carry too, contradicted by the rows) more
rows than ``d_model`` are packed and at most ``d_model`` shared (the paper's
naming: ``c_kv`` is the shared projection). Tied tensors follow
``loaders.canonical``: present, identical, counted once.

The whole language model (``convert_model``, for a forward pass; ``_body``'s names),
as every file above builds it: GPT-2 style, pre-norm,
``x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))``,
``nn.LayerNorm(n_embd, eps=layer_norm_epsilon)`` with bias for ``ln_1``, ``ln_2``,
``ln_f``; token ``wte`` plus learned position ``wpe`` (``n_positions`` rows)
embeddings at the top level, blocks in ``h``; logits ``ln_f(x) @ wte.weight.T``
when ``tie_word_embeddings`` (a lambda, no ``lm_head.weight`` key), else an
``lm_head`` Linear without bias; causal attention; the MLP is ``mlp.c_fc``
``[n_inner, n_embd]`` -> ``nn.GELU()`` (exact) -> ``mlp.c_proj``. Any other
tensor (e.g. the 2D positional correction of their ``(Q=K)+`` variants) is
refused, as are the synthetic-task encoders (``blocks.N``; one-hot inputs, no
causal mask): they are not causal language models.
"""
from __future__ import annotations

from analysis.variants import Q_TIED
from loaders.canonical import AttentionWeights
from loaders.errors import CheckpointFormatError
from loaders.layouts import _common as C
from loaders.layouts._body import Body, NotRunnable, gather, listed
from loaders.layouts._converters import split_concat

NAME = "projection_sharing"
PRIORITY = 10

_MODS = ("c_attn", "c_q", "c_k", "c_v", "c_kv", "c_qk", "c_qkv")
_RX = (r"^(?P<p>(?:.*\.)?)(?:h|blocks)\.(?P<i>\d+)\.attn\.(?P<m>"
       + "|".join(_MODS) + r")\.weight$")
_SHARED = ("c_q", "c_k", "c_v", "c_kv", "c_qk", "c_qkv")
_KV_NAMES = ("n_kv_groups", "n_kv_heads", "n_kv_head", "num_kv_heads")
_PATTERNS = "c_attn | c_q+c_k+c_v | c_q+c_kv | c_q+c_k | c_k+c_v | c_qk+c_v | c_k | c_kv | c_qkv"


def _config(source) -> dict:
    conf = {}
    extra = (source.extras or {}).get("config")
    if isinstance(extra, dict):
        conf.update(extra)
    conf.update(source.config or {})
    return conf


def _get(conf, *names, default=None):
    for n in names:
        if conf.get(n) is not None:
            return conf[n]
    return default


def _kv_rows(rows: int, n_kv_conf, d: int, dh: int) -> tuple[bool, int]:
    """(packed, n_kv) of a ``c_kv`` of ``rows`` rows: packed ``[k; v]`` (2 * n_kv * d_head
    rows) or one tensor used as K and V (n_kv * d_head rows). The config's kv-head count
    decides where it fits exactly one of the two; otherwise (absent, or their default
    ``n_kv_groups=1`` in a file whose shapes say more) more rows than ``d_model`` are
    packed and at most ``d_model`` shared."""
    if n_kv_conf is not None and int(n_kv_conf) > 0:
        n_kv = int(n_kv_conf)
        if rows == 2 * n_kv * dh:
            return True, n_kv
        if rows == n_kv * dh:
            return False, n_kv
    return (True, rows // (2 * dh)) if rows > d else (False, rows // dh)


def _modules(source, keys) -> tuple[str, dict[int, set[str]]]:
    rx = C.re.compile(_RX)
    mods: dict[int, set[str]] = {}
    for k in keys:
        m = rx.match(k)
        if m:
            mods.setdefault(int(m.group("i")), set()).add(m.group("m"))
    return rx, mods


def detect(source) -> bool:
    if C.model_type(source) is not None:
        return False
    _, mods = _modules(source, source.keys())
    if not mods:
        return False
    first = mods.get(0, set())
    if first & set(_SHARED):
        return True
    extras = source.extras or {}
    return "c_attn" in first and ("tokens_seen" in extras or "train_config" in extras
                                  or _get(_config(source), *_KV_NAMES) is not None)


def convert(source):
    keys = source.keys()
    have = set(keys)
    conf = _config(source)
    _, mods = _modules(source, keys)
    p, layers = C.find_layers(source, _RX, keys)
    C.check_layers(source, len(layers), _get(conf, "n_layer", "n_layers"))
    first = sorted(mods[0])
    for i in layers:
        if mods[i] != mods[0]:
            raise CheckpointFormatError(
                source.path, f"layer {i} has attention modules {', '.join(sorted(mods[i]))}; "
                             f"layer 0 has {', '.join(first)}")
    m0 = set(first)

    def stem(i, m):
        return f"{p}h.{i}.attn.{m}" if f"{p}h.0.attn.{first[0]}.weight" in have \
            else f"{p}blocks.{i}.attn.{m}"

    w0 = stem(0, "c_q" if "c_q" in m0 else first[0]) + ".weight"
    d = int(_get(conf, "n_embd", "d_model", default=source.shape(w0)[1]))
    n = C.need_int(source, _get(conf, "n_head", "n_heads"), "head count", ("n_head",))
    dh = C.split_heads_check(source, d, n, _get(conf, "head_dim"))
    # The kv-head count comes from the shapes wherever they fix it; the config's
    # only where they do not (a c_kv beside c_q: shared K=V or packed [k; v]).
    # Their ModelConfig declares n_kv_groups (default 1) for every variant
    # (run_eval.py), so an MHA checkpoint may carry n_kv_groups=1.
    n_kv = None

    # (variant, {role: module}); roles q, k, v, kv (packed [k; v]) or qkv (fused)
    if m0 == {"c_attn"}:
        variant, roles = "qkv", {"qkv": "c_attn"}
        extra = source.shape(stem(0, "c_attn") + ".weight")[0] - n * dh   # 2 * kv * d_head rows
        if extra > 0 and extra % (2 * dh) == 0:
            n_kv = extra // (2 * dh)
    elif m0 == {"c_q", "c_k", "c_v"}:
        variant, roles = "qkv", {"q": "c_q", "k": "c_k", "v": "c_v"}
    elif m0 in ({"c_q", "c_kv"}, {"c_kv"}):
        packed, n_kv = _kv_rows(source.shape(stem(0, "c_kv") + ".weight")[0],
                                _get(conf, *_KV_NAMES), d, dh)
        if "c_q" not in m0:     # transformer_QK_300_M.py: k, v = c_kv(x).split(n_embd); q = k
            variant, roles = ("q_eq_k", {"kv": "c_kv"}) if packed else \
                ("q_eq_k_eq_v", {"q": "c_kv", "k": "c_kv", "v": "c_kv"})
        elif packed:
            variant, roles = "qkv", {"q": "c_q", "kv": "c_kv"}
        else:
            variant, roles = "k_eq_v", {"q": "c_q", "k": "c_kv", "v": "c_kv"}
    elif m0 == {"c_q", "c_k"}:
        variant, roles = "k_eq_v", {"q": "c_q", "k": "c_k", "v": "c_k"}
    elif m0 in ({"c_k", "c_v"}, {"c_qk", "c_v"}):
        kk = "c_k" if "c_k" in m0 else "c_qk"
        variant, roles = "q_eq_k", {"q": kk, "k": kk, "v": "c_v"}
    elif m0 in ({"c_k"}, {"c_qkv"}):
        only = first[0]
        variant, roles = "q_eq_k_eq_v", {"q": only, "k": only, "v": only}
    else:
        raise CheckpointFormatError(
            source.path, f"attention modules {', '.join(first)} at layer 0 match no "
                         f"projection-sharing variant; expected one of {_PATTERNS}")
    if n_kv is None:
        kmod = roles.get("k")
        n_kv = source.shape(stem(0, kmod) + ".weight")[0] // dh if kmod else n
        n_kv = n_kv or n                   # fewer rows than one head: the shape check names it
    n_kv = int(n_kv)
    if n_kv <= 0 or n % n_kv:
        raise CheckpointFormatError(
            source.path, f"{n} heads cannot be grouped over {n_kv} kv heads")

    why = C.basis(d, n, n_kv, dh)
    rows = {"q": n * dh, "k": n_kv * dh, "v": n_kv * dh, "kv": 2 * n_kv * dh,
            "qkv": (n + 2 * n_kv) * dh}
    if variant in Q_TIED:
        rows["q"] = n_kv * dh   # the query is the key projection
    module_rows = {}
    for role, mod in roles.items():
        module_rows[mod] = rows[role]
    C.require(source, [stem(i, m) + ".weight" for i in layers for m in [*module_rows, "c_proj"]],
              have, NAME)
    attn_keys = []
    for i in layers:
        for mod, r in module_rows.items():
            C.expect_shape(source, stem(i, mod) + ".weight", (r, d), i, why)
            attn_keys.append(stem(i, mod) + ".weight")
            if stem(i, mod) + ".bias" in have:
                C.expect_shape(source, stem(i, mod) + ".bias", (r,), i, why)
                attn_keys.append(stem(i, mod) + ".bias")
        C.expect_shape(source, stem(i, "c_proj") + ".weight", (d, n * dh), i, why)
        attn_keys.append(stem(i, "c_proj") + ".weight")
        if stem(i, "c_proj") + ".bias" in have:
            C.expect_shape(source, stem(i, "c_proj") + ".bias", (d,), i, why)
            attn_keys.append(stem(i, "c_proj") + ".bias")

    geom = C.Geometry(len(layers), n, n_kv, d, dh)
    meta = C.make_meta(source, architecture=NAME, variant=variant, geom=geom, norm="layernorm",
                       positions="learned", attn_scale=None, dtype_key=w0,
                       attention_keys=attn_keys)
    get = C.getter(source, have)

    def build(i: int) -> AttentionWeights:
        w = {m: get(stem(i, m) + ".weight") for m in module_rows}
        b = {m: get(stem(i, m) + ".bias") for m in module_rows}
        if "qkv" in roles:
            split = split_concat(n, n_kv, dh)
            wq, wk, wv = split(w["c_attn"])
            bq, bk, bv = split(b["c_attn"]) if b["c_attn"] is not None else (None,) * 3
        elif "kv" in roles:
            wq, bq = w.get("c_q"), b.get("c_q")      # None for q = k: W_Q is W_K below
            r = n_kv * dh
            wk, wv = w["c_kv"][:r], w["c_kv"][r:]
            bk, bv = (None, None) if b["c_kv"] is None else (b["c_kv"][:r], b["c_kv"][r:])
        else:
            wq, wk, wv = (w[roles[x]] for x in "qkv")
            bq, bk, bv = (b[roles[x]] for x in "qkv")
        W_K = C.rows_to_heads(wk, n_kv, dh)
        W_V = C.rows_to_heads(wv, n_kv, dh)
        b_K, b_V = C.bias_heads(bk, n_kv, dh), C.bias_heads(bv, n_kv, dh)
        if variant in Q_TIED:
            W_Q = C.expand_kv(W_K, n)
            b_Q = None if b_K is None else C.expand_kv(b_K, n)
        else:
            W_Q, b_Q = C.rows_to_heads(wq, n, dh), C.bias_heads(bq, n, dh)
        bo = get(stem(i, "c_proj") + ".bias")
        return AttentionWeights(
            layer=i, W_Q=W_Q, W_K=W_K, W_V=W_V,
            W_O=C.cols_to_heads(get(stem(i, "c_proj") + ".weight"), n, dh),
            b_Q=b_Q, b_K=b_K, b_V=b_V, b_O=None if bo is None else C.fresh(bo))

    return meta, C.layer_fn(build)



def convert_model(source):
    """``convert``'s (meta, layer_fn) and the language model's :class:`Body` (module docstring)."""
    keys = source.keys()
    if not C.any_match(keys, r"^(?:.*\.)?h\.\d+\.") and C.any_match(keys, r"^(?:.*\.)?blocks\.\d+\."):
        raise NotRunnable("a synthetic-task encoder (blocks.N: one-hot inputs, no causal mask) is not "
                          "a causal language model")
    meta, layer = convert(source)
    p, _ = C.find_layers(source, _RX, keys)
    _, mods = _modules(source, keys)
    tensors = gather(
        source, block=p + "h.{i}.",
        top={p + "wte.weight": "embed", p + "wpe.weight": "pos_embed", p + "lm_head.weight": "unembed",
             p + "ln_f.weight": "ln_final.weight", p + "ln_f.bias": "ln_final.bias"},
        modules={"ln_1": "ln1", "ln_2": "ln2", "mlp.c_fc": "mlp.in", "mlp.c_proj": "mlp.out"},
        attention=[f"attn.{m}" for m in (*mods[0], "c_proj")],
        hint=(f"a {meta.variant} layer runs {', '.join(sorted(mods[0]))} and c_proj; the MLP is "
              "mlp.c_fc and mlp.c_proj"))
    if "embed" not in tensors:
        raise NotRunnable(f"expected wte.weight and blocks h.N.*; found {listed(keys)}")
    if "blocks.0.mlp.in.weight" not in tensors:
        raise NotRunnable("expected the MLP as h.N.mlp.c_fc and h.N.mlp.c_proj; found no h.0.mlp.c_fc.weight")
    if "pos_embed" not in tensors:
        raise NotRunnable("expected learned positions wpe.weight; found none")
    eps = _get(_config(source), "layer_norm_epsilon", "layer_norm_eps", default=1e-5)
    return meta, layer, Body(tensors, mlp="gelu", context=tensors["pos_embed"].shape[0], norm_eps=float(eps))
