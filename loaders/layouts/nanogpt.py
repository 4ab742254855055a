"""nanoGPT (karpathy/nanoGPT) and forks that keep its module names.

Keys (``_orig_mod.``/``module.`` already stripped by the source reader):
``transformer.h.{i}.attn.c_attn.weight`` is an ``nn.Linear`` of shape
``[3*d_model, d_model]`` computing ``x @ W.T + b``; rows ``[q; k; v]``, each
``n_heads`` blocks of ``d_head`` (``q.view(B, T, n_head, C // n_head)``).
``c_proj.weight`` is ``[d_model, d_model]``. Biases exist when
``bias``/``use_bias`` is true. The causal-mask buffer ``attn.bias``
``[1, 1, T, T]`` (saved when flash attention is unavailable) is not a
parameter and is ignored.

``model_args`` names: ``n_layer``/``n_head``/``n_embd``, and the
``num_layers``/``num_heads``/``dim_embedding`` of some forks (e.g.
sqtian/GPT_by_Hand). ``d_model`` and the layer count come from the shapes when
absent; the head count cannot and must be in the config (or ``head_size``).

The norm (``norm_of``): what the config declares (``norm``/``norm_type``/
``normalization``/``norm_layer`` naming RMS or Layer norm, or a true
``use_rmsnorm``/``rmsnorm``/``use_rms_norm``), else the tensors: a norm with a
bias is a LayerNorm; a norm weight without a bias is an RMSNorm when its name
says ``rms``, when the block has a SwiGLU MLP (``w1/w2/w3``,
``gate_proj/up_proj/down_proj``, ``w_gate/w_up/w_down``, the Llama-style block
of forks such as andrew-noble/small-gpt, whose ``nn.RMSNorm`` and ``ffd.w1/w2/w3``
sit beside a config without a norm field), or when the Linears have biases
(nanoGPT's LayerNorm has one whenever they do), and a LayerNorm when the config
says ``bias``/``use_bias`` false (nanoGPT's ``LayerNorm(bias=False)``); with no
bias setting at all, a weight without a bias reads as RMSNorm. A weight without
a bias is what both ``nn.RMSNorm`` and a bias-free LayerNorm store, so the
reading and its reason are kept in ``meta.notes["norm"]`` (``info --json``).

The whole model (``convert_model``, for a forward pass; ``_body``'s names):
``transformer.wte`` and learned ``transformer.wpe`` (its rows: the context),
blocks ``transformer.h.{i}`` with ``ln_1``, ``attn``, ``ln_2`` and an MLP,
``transformer.ln_f``, and ``lm_head`` (absent or equal to ``wte``: tied). Norm
parameters named ``gamma``/``beta`` are read as weight/bias. The MLP module is
``mlp`` (or a fork's ``ffd``, ``ffn``, ``feed_forward``): ``c_fc`` -> GELU ->
``c_proj``, or a SwiGLU ``down(silu(gate x) * up x)`` named ``w1``/``w3``/``w2``
(gate/up/down, llama2.c's and small-gpt's names), ``gate_proj``/``up_proj``/
``down_proj`` (Hugging Face's) or ``w_gate``/``w_up``/``w_down``. A fused
``c_fc`` of twice ``c_proj``'s width is refused: which half gates is not
recorded in the weights. Norm eps: ``norm_eps``/``rms_norm_eps``/
``layer_norm_epsilon``/``eps``, else the torch module's default: 1e-5
(``nn.LayerNorm``), or ``finfo(float32).eps`` for an RMSNorm (``nn.RMSNorm``'s
``eps=None``). ``model_args`` may name the width ``n_embed`` (small-gpt).
"""
from __future__ import annotations

import torch

from loaders.canonical import AttentionWeights
from loaders.layouts import _common as C
from loaders.layouts._body import NORM_ALIASES, Body, NotRunnable, aliased, gather, listed

NAME = "nanogpt"
PRIORITY = 50

RX = r"^(?P<p>(?:.*\.)?)h\.(?P<i>\d+)\.attn\.c_attn\.weight$"
_N_LAYER = ("n_layer", "num_layers", "n_layers")
_N_HEAD = ("n_head", "num_heads", "n_heads")
_D_MODEL = ("n_embd", "n_embed", "dim_embedding", "d_model")


def _first_c_attn(source):
    for k in source.keys():
        m = C.re.match(RX, k)
        if m and m.group("i") == "0":
            return k
    return None


def detect(source) -> bool:
    if C.model_type(source) is not None:
        return False
    k = _first_c_attn(source)
    if k is None:
        return False
    shape = source.shape(k)
    return len(shape) == 2 and shape[0] == 3 * shape[1]


def geometry(source, keys, rows_per_d: int):
    """(prefix, layers, d_model, n_heads, d_head) of a nanoGPT-style source whose
    ``c_attn`` has ``rows_per_d * d_model`` rows."""
    p, layers = C.find_layers(source, RX, keys)
    C.check_layers(source, len(layers), C.cfg(source, *_N_LAYER))
    first = f"{p}h.0.attn.c_attn.weight"
    d = C.cfg_int(source, *_D_MODEL, default=source.shape(first)[1])
    n = C.cfg(source, *_N_HEAD)
    head_size = C.cfg(source, "head_size")
    if n is None and head_size:
        n = d // int(head_size)
    n = C.need_int(source, n, "head count", _N_HEAD)
    dh = C.split_heads_check(source, d, n, None)
    return p, layers, d, n, dh


def validate(source, p, layers, d, rows_per_d, have, layout=NAME):
    """Check every layer's c_attn/c_proj shapes; return the attention keys."""
    why = f"d_model {d}"
    C.require(source, [f"{p}h.{i}.attn.{m}.weight" for i in layers for m in ("c_attn", "c_proj")],
              have, layout)
    attn_keys = []
    for i in layers:
        ka, kp = f"{p}h.{i}.attn.c_attn.weight", f"{p}h.{i}.attn.c_proj.weight"
        C.expect_shape(source, ka, (rows_per_d * d, d), i, why)
        C.expect_shape(source, kp, (d, d), i, why)
        attn_keys += [ka, kp]
        for kb, shape in ((f"{p}h.{i}.attn.c_attn.bias", (rows_per_d * d,)),
                          (f"{p}h.{i}.attn.c_proj.bias", (d,))):
            if kb in have:
                C.expect_shape(source, kb, shape, i, why)
                attn_keys.append(kb)
    return attn_keys


_NORM_FIELDS = ("norm", "norm_type", "normalization", "norm_layer", "layer_norm_type")
_RMS_FLAGS = ("use_rmsnorm", "rmsnorm", "use_rms_norm")
#: (gate, up, down) module names of SwiGLU MLPs, as the code that trained them names them.
SWIGLU = (("w1", "w3", "w2"), ("gate_proj", "up_proj", "down_proj"), ("w_gate", "w_up", "w_down"))
#: What forks call a block's MLP module (nanoGPT ``mlp``; andrew-noble/small-gpt ``ffd``).
MLP_STEMS = ("mlp", "ffd", "ffn", "feed_forward")
#: Why a weight without a bias is no proof of RMSNorm, said in every reading from the tensors.
_ALIKE = "the weights alone cannot tell nn.RMSNorm from a bias-free LayerNorm"


def norm_of(source, p: str, have: set[str]) -> tuple[str, str]:
    """(``rmsnorm`` or ``layernorm``, how that was decided) of a nanoGPT-style source
    (module docstring); reads only key names and the config."""
    for name in _NORM_FIELDS:
        v = C.cfg(source, name)
        if isinstance(v, str) and "rms" in v.lower():
            return "rmsnorm", f"the config's {name} is {v!r}"
        if isinstance(v, str) and "layer" in v.lower():
            return "layernorm", f"the config's {name} is {v!r}"
    for name in _RMS_FLAGS:
        v = C.cfg(source, name)
        if isinstance(v, bool):
            return ("rmsnorm" if v else "layernorm"), f"the config's {name} is {v}"
    block = f"{p}h.0."
    norms = sorted({k[len(block):].rsplit(".", 1)[0] for k in have
                    if k.startswith(block)
                    and not k[len(block):].startswith(tuple(f"{m}." for m in ("attn", *MLP_STEMS)))
                    and k.endswith((".weight", ".gamma", ".scale"))})
    if not norms:
        return "layernorm", "no norm parameters (nanoGPT's default LayerNorm)"
    if any(f"{block}{m}.{b}" in have for m in norms for b in ("bias", "beta")):
        return "layernorm", "the norms have a bias, which RMSNorm has not"
    if any("rms" in m.lower() for m in norms):
        return "rmsnorm", f"the norm modules' names ({', '.join(norms)}) say rms"
    mlp = mlp_module(have, block)
    if mlp is not None and mlp[1] in SWIGLU:
        stem, names = mlp
        return "rmsnorm", (f"norm weights without a bias beside a SwiGLU MLP ({stem}.{'/'.join(names)}), "
                           f"the Llama-style block; {_ALIKE}")
    if f"{block}attn.c_attn.bias" in have:
        return "rmsnorm", ("norm weights without a bias while the Linears have biases (nanoGPT's "
                           f"LayerNorm has one whenever they do); {_ALIKE}")
    bias = C.cfg(source, "bias", "use_bias")
    if isinstance(bias, bool) and not bias:
        return "layernorm", f"norm weights without a bias and the config's bias=False (nanoGPT's LayerNorm(bias=False)); {_ALIKE}"
    return "rmsnorm", f"norm weights without a bias and no bias setting in the config; {_ALIKE}"


def convert(source):
    keys = source.keys()
    have = set(keys)
    p, layers, d, n, dh = geometry(source, keys, 3)
    attn_keys = validate(source, p, layers, d, 3, have)
    geom = C.Geometry(len(layers), n, n, d, dh)
    norm, how = norm_of(source, p, have)
    meta = C.make_meta(source, architecture=NAME, variant="qkv", geom=geom, norm=norm,
                       positions="learned", attn_scale=None,
                       dtype_key=f"{p}h.0.attn.c_attn.weight", attention_keys=attn_keys,
                       notes={"norm": f"{norm}: {how}"})
    get = C.getter(source, have)

    def build(i: int) -> AttentionWeights:
        w = get(f"{p}h.{i}.attn.c_attn.weight")   # [3d, d], x @ w.T
        b = get(f"{p}h.{i}.attn.c_attn.bias")     # [3d] or None
        bo = get(f"{p}h.{i}.attn.c_proj.bias")
        return AttentionWeights(
            layer=i,
            W_Q=C.rows_to_heads(w[:d], n, dh),
            W_K=C.rows_to_heads(w[d:2 * d], n, dh),
            W_V=C.rows_to_heads(w[2 * d:], n, dh),
            W_O=C.cols_to_heads(get(f"{p}h.{i}.attn.c_proj.weight"), n, dh),
            b_Q=None if b is None else C.bias_heads(b[:d], n, dh),
            b_K=None if b is None else C.bias_heads(b[d:2 * d], n, dh),
            b_V=None if b is None else C.bias_heads(b[2 * d:], n, dh),
            b_O=None if bo is None else C.fresh(bo))

    return meta, C.layer_fn(build)


def swiglu_names(have: set[str], stem: str) -> tuple[str, str, str] | None:
    """The (gate, up, down) names under ``stem`` (``transformer.h.0.mlp.``) whose ``.weight``
    keys are all in ``have``, else None."""
    for names in SWIGLU:
        if all(f"{stem}{n}.weight" in have for n in names):
            return names
    return None


def mlp_module(have: set[str], block: str) -> tuple[str, tuple[str, ...]] | None:
    """(stem, module names) of block ``block``'s (``transformer.h.0.``) MLP: a SwiGLU of
    ``SWIGLU`` names or GELU ``c_fc``/``c_proj``, under one of ``MLP_STEMS``; else None."""
    for stem in MLP_STEMS:
        names = swiglu_names(have, f"{block}{stem}.")
        if names is None and all(f"{block}{stem}.{n}.weight" in have for n in ("c_fc", "c_proj")):
            names = ("c_fc", "c_proj")
        if names is not None:
            return stem, names
    return None


def model_body(source) -> Body:
    """The non-attention tensors of a nanoGPT-style source (module docstring), its
    attention modules ``attn.c_attn``/``attn.c_proj`` left to the canonical layers."""
    keys = source.keys()
    have = set(keys)
    p, _ = C.find_layers(source, RX, keys)
    for need in (f"{p}wte.weight", f"{p}wpe.weight"):
        if need not in have:
            raise NotRunnable(f"expected {need} (learned positions, fused c_attn); found {listed(keys)}")
    found_mlp = mlp_module(have, f"{p}h.0.")
    if found_mlp is None:
        found = sorted({k[len(f"{p}h.0."):].rsplit(".", 1)[0] for k in have if k.startswith(f"{p}h.0.")
                        and k[len(f"{p}h.0."):].startswith(tuple(f"{m}." for m in MLP_STEMS))})
        raise NotRunnable(f"the MLP ({', '.join(found) or 'none'}) is neither c_fc/c_proj (GELU) nor a "
                          f"named SwiGLU ({'; '.join('/'.join(n) for n in SWIGLU)}) under "
                          f"{'/'.join(MLP_STEMS)}")
    stem, names = found_mlp
    swiglu = names in SWIGLU
    if not swiglu:
        fc, proj = f"{p}h.0.{stem}.c_fc.weight", f"{p}h.0.{stem}.c_proj.weight"
        hidden = source.shape(fc)[0]
        if source.shape(proj)[1] * 2 == hidden:
            raise NotRunnable(f"{stem}.c_fc has {hidden} rows, twice {stem}.c_proj's {hidden // 2} columns: a "
                              f"fused SwiGLU whose gate half is not recorded in the weights")
        modules = {f"{stem}.c_fc": "mlp.in", f"{stem}.c_proj": "mlp.out"}
    else:
        modules = {f"{stem}.{names[0]}": "mlp.gate", f"{stem}.{names[1]}": "mlp.in",
                   f"{stem}.{names[2]}": "mlp.out"}
    root = p.removesuffix("transformer.")
    top = aliased({f"{p}wte.weight": "embed", f"{p}wpe.weight": "pos_embed",
                   f"{p}ln_f.weight": "ln_final.weight", f"{p}ln_f.bias": "ln_final.bias",
                   f"{root}lm_head.weight": "unembed"}, NORM_ALIASES)
    tensors = gather(source, top=top, block=p + "h.{i}.", modules={"ln_1": "ln1", "ln_2": "ln2", **modules},
                     attention=("attn.c_attn", "attn.c_proj"), aliases=NORM_ALIASES)
    # no eps in the config: the torch module's default, nn.LayerNorm's 1e-5 or nn.RMSNorm's
    # eps=None, which is finfo(dtype).eps of its float32 input
    default = float(torch.finfo(torch.float32).eps) if norm_of(source, p, have)[0] == "rmsnorm" else 1e-5
    eps = C.cfg_float(source, "norm_eps", "rms_norm_eps", "layer_norm_epsilon", "eps", default=default)
    return Body(tensors, mlp="swiglu" if swiglu else "gelu", context=source.shape(f"{p}wpe.weight")[0],
                norm_eps=eps)


def convert_model(source):
    """``convert``'s (meta, layer_fn) and the model's :class:`Body` (module docstring)."""
    meta, layer = convert(source)
    return meta, layer, model_body(source)
