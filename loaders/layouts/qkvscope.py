"""qkvscope's own variant models (``experiments/model.py``), as its trainer saves them.

Safetensors whose header metadata holds ``qkvscope_config`` (the model's
``GPTConfig`` as JSON) and ``qkvscope_run`` (step, tokens, weight decay, lr,
seed as JSON); a source whose own ``config`` carries ``variant`` and
``n_kv_heads`` next to ``blocks.0.attn.o.weight`` is read the same way.

Keys per layer ``i`` (``nn.Linear``, ``[out, in]``, output row
``head * d_head + j``), the variant's real parameter set:

================  ==========================  ==========================
variant           projection keys             shapes
================  ==========================  ==========================
``qkv``           ``q``, ``k``, ``v``         q ``[n*dh, d]``, k/v ``[n_kv*dh, d]``
``wq_identity``   ``k``, ``v``                (no query weight)
``q_eq_k``        ``qk``, ``v``               qk ``[n_kv*dh, d]``
``k_eq_v``        ``q``, ``kv``               kv ``[n_kv*dh, d]``
``q_eq_k_eq_v``   ``qkv``                     ``[n_kv*dh, d]``
``*_plus``        as the base variant         plus ``pos_w`` ``[m]``, ``pos_b`` ``[1]``
================  ==========================  ==========================

all as ``blocks.{i}.attn.<name>.weight`` (and ``.bias`` when trained with
biases), output ``blocks.{i}.attn.o.weight`` ``[d, n*dh]``.

The vision models (``config`` ``task`` = ``image``, :mod:`experiments.vision`)
have the same block keys after a patch embedding; their geometry is read the
same way. Paper B's "+" variants (``q_eq_k_plus``, ``q_eq_k_eq_v_plus``) hold
the base variant's projections and two small tensors of the 2D positional
score correction per layer, which the canonical container does not carry.

Canonical tensors follow ``loaders.canonical``'s tied convention: a tied
tensor is read once and appears under every name it serves (``q_eq_k``:
``W_Q = W_K`` expanded to n_heads as ``W_K[h // group]``; ``k_eq_v``:
``W_V = W_K``); ``wq_identity`` has ``W_Q = None``. Parameter counts count
each stored tensor once.
"""
from __future__ import annotations

import json
from dataclasses import replace

from analysis.variants import ALL_VARIANTS as VARIANTS, PLUS
from loaders.canonical import AttentionWeights
from loaders.errors import CheckpointFormatError
from loaders.layouts import _common as C

NAME = "qkvscope"
PRIORITY = 5
CONFIG_KEY = "qkvscope_config"
RUN_KEY = "qkvscope_run"

#: projection tensor -> canonical roles it serves
PROJECTIONS = {
    "qkv": {"q": ("Q",), "k": ("K",), "v": ("V",)},
    "wq_identity": {"k": ("K",), "v": ("V",)},
    "q_eq_k": {"qk": ("Q", "K"), "v": ("V",)},
    "k_eq_v": {"q": ("Q",), "kv": ("K", "V")},
    "q_eq_k_eq_v": {"qkv": ("Q", "K", "V")},
}
PROJECTIONS.update({plus: PROJECTIONS[b] for plus, b in PLUS.items()})


def _metadata(source) -> dict:
    meta = (source.extras or {}).get("safetensors_metadata") or {}
    return meta if isinstance(meta, dict) else {}


def detect(source) -> bool:
    if CONFIG_KEY in _metadata(source):
        return True
    config = source.config or {}
    return ("variant" in config and "n_kv_heads" in config
            and "blocks.0.attn.o.weight" in set(source.keys()))


def _config(source) -> dict:
    raw = _metadata(source).get(CONFIG_KEY)
    if raw is None:
        return dict(source.config or {})
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise CheckpointFormatError(
            source.path, f"safetensors metadata '{CONFIG_KEY}' is not valid JSON ({exc.msg} at "
                         f"character {exc.pos}); expected the model config as a JSON object") from None
    if not isinstance(config, dict):
        raise CheckpointFormatError(
            source.path, f"safetensors metadata '{CONFIG_KEY}' holds a JSON {type(config).__name__}; "
                         "expected the model config as a JSON object")
    return config


def _run(source) -> dict:
    raw = _metadata(source).get(RUN_KEY)
    try:
        run = json.loads(raw) if raw is not None else {}
    except json.JSONDecodeError:
        raise CheckpointFormatError(
            source.path, f"safetensors metadata '{RUN_KEY}' is not valid JSON; "
                         "expected step, tokens and training settings as a JSON object") from None
    return run if isinstance(run, dict) else {}


def convert(source):
    config = _config(source)
    have = set(source.keys())
    missing_cfg = sorted(k for k in ("variant", "n_layer", "n_head", "d_model") if k not in config)
    if missing_cfg:
        raise CheckpointFormatError(
            source.path, f"qkvscope config lacks {', '.join(missing_cfg)}; expected a GPTConfig "
                         f"with variant, n_layer, n_head, n_kv_heads, d_model, d_head")
    variant = config["variant"]
    if variant not in VARIANTS:
        raise CheckpointFormatError(
            source.path, f"qkvscope config variant '{variant}' is not one of {', '.join(VARIANTS)}")
    d, n = int(config["d_model"]), int(config["n_head"])
    n_kv = int(config.get("n_kv_heads") or n)
    dh = C.split_heads_check(source, d, n, config.get("d_head"))
    prefix, layers = C.find_layers(source, r"(?P<p>.*?)blocks\.(?P<i>\d+)\.attn\.o\.weight$")
    if not layers:
        raise CheckpointFormatError(
            source.path, "no 'blocks.N.attn.o.weight' tensors; expected a qkvscope variant model")
    C.check_layers(source, len(layers), config.get("n_layer"))
    why = C.basis(d, n, n_kv, dh)
    projections = PROJECTIONS[variant]
    rows = {name: (n if name == "q" else n_kv) * dh for name in projections}
    attn_keys: list[str] = []
    for i in layers:
        stem = f"{prefix}blocks.{i}.attn."
        C.require(source, [stem + p + ".weight" for p in (*projections, "o")], have, NAME)
        for p, r in rows.items():
            C.expect_shape(source, stem + p + ".weight", (r, d), i, why)
            attn_keys.append(stem + p + ".weight")
            if stem + p + ".bias" in have:
                C.expect_shape(source, stem + p + ".bias", (r,), i, why)
                attn_keys.append(stem + p + ".bias")
        C.expect_shape(source, stem + "o.weight", (d, n * dh), i, why)
        attn_keys.append(stem + "o.weight")
        # the "+" variants' score correction (w, b): attention parameters, not in the container
        attn_keys += [stem + k for k in ("pos_w", "pos_b") if stem + k in have]
        if stem + "o.bias" in have:
            C.expect_shape(source, stem + "o.bias", (d,), i, why)
            attn_keys.append(stem + "o.bias")
    geom = C.Geometry(len(layers), n, n_kv, d, dh)
    full_config = dict(config)
    run = _run(source)
    if run:
        full_config["run"] = run
    first = f"{prefix}blocks.0.attn.{next(iter(projections))}.weight"
    meta = C.make_meta(source, architecture=NAME, variant=variant, geom=geom,
                       norm=config.get("norm", "layernorm"),
                       positions=config.get("positions", "learned"),
                       attn_scale=config.get("attn_scale"), dtype_key=first,
                       attention_keys=attn_keys)
    meta = replace(meta, config=C.jsonable(full_config))
    get = C.getter(source, have)

    def build(i: int) -> AttentionWeights:
        stem = f"{prefix}blocks.{i}.attn."
        out: dict = {"W_Q": None, "W_K": None, "W_V": None, "b_Q": None, "b_K": None, "b_V": None}
        for p, roles in projections.items():
            w, b = get(stem + p + ".weight"), get(stem + p + ".bias")
            heads = n if p == "q" else n_kv
            for role in roles:
                W = C.rows_to_heads(w, heads, dh)          # [heads, d, dh]
                B = C.bias_heads(b, heads, dh)             # [heads, dh] or None
                if role == "Q" and heads != n:
                    # q = k: query head h reads kv head h // (n // n_kv)
                    W = C.expand_kv(W, n)
                    B = None if B is None else C.expand_kv(B, n)
                out["W_" + role], out["b_" + role] = W, B
        bo = get(stem + "o.bias")
        return AttentionWeights(
            layer=i, W_Q=out["W_Q"], W_K=out["W_K"], W_V=out["W_V"],
            W_O=C.cols_to_heads(get(stem + "o.weight"), n, dh),
            b_Q=out["b_Q"], b_K=out["b_K"], b_V=out["b_V"],
            b_O=None if bo is None else C.fresh(bo))

    return meta, C.layer_fn(build)
