"""Meta's original Llama layout and llama2.c (karpathy/llama2.c ``model.py``).

Keys: ``layers.{i}.attention.{wq,wk,wv,wo}.weight``, ``nn.Linear`` without
bias: wq ``[n_heads*d_head, dim]``, wk/wv ``[n_kv_heads*d_head, dim]`` (GQA),
wo ``[dim, n_heads*d_head]``. Config (llama2.c ``model_args``, Meta
``params.json``): ``dim``, ``n_layers``, ``n_heads``, ``n_kv_heads`` (None or
absent: ``n_heads``). Rotary positions on interleaved pairs (Meta's own row
order, kept). RMSNorm; ``attn_scale = 1/sqrt(d_head)``.
"""
from __future__ import annotations

from loaders.layouts import _common as C

NAME = "llama_meta"
PRIORITY = 20

_RX = r"^(?P<p>(?:.*\.)?)layers\.(?P<i>\d+)\.attention\.wq\.weight$"


def detect(source) -> bool:
    return C.model_type(source) is None and C.any_match(source.keys(), _RX)


def convert(source):
    keys = source.keys()
    have = set(keys)
    p, layers = C.find_layers(source, _RX, keys)
    C.check_layers(source, len(layers), C.cfg(source, "n_layers", "n_layer"))
    q0 = f"{p}layers.0.attention.wq.weight"
    d = C.cfg_int(source, "dim", default=source.shape(q0)[1])
    n = C.need_int(source, C.cfg(source, "n_heads"), "head count", ("n_heads",))
    dh = C.split_heads_check(source, d, n, None)
    n_kv = C.cfg_int(source, "n_kv_heads", default=n)
    names = {r: p + "layers.{i}.attention.w" + r for r in "qkvo"}
    return C.convert_separate(source, name=NAME, names=names, layers=layers, d=d, n=n,
                              n_kv=n_kv, dh=dh, norm="rmsnorm", positions="rotary",
                              attn_scale=None, have=have)
