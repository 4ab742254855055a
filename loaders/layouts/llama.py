"""Hugging Face Llama family: Llama, Mistral, Mixtral, Qwen2, OLMo, Granite (Qwen3 and OLMo 2,
whose QK-norm gains this layout does not read, have their own: ``qwen3.py``, ``olmo2.py``).

Keys (prefix ``model.`` or none): ``layers.{i}.self_attn.{q,k,v,o}_proj.weight``,
``nn.Linear``: q ``[n_heads*d_head, d_model]``, k/v
``[n_kv_heads*d_head, d_model]`` (GQA), o ``[d_model, n_heads*d_head]``. Biases
on q/k/v in Qwen2 (and with ``attention_bias``). Config: ``hidden_size``,
``num_attention_heads``, ``num_key_value_heads`` (default: ``num_attention_heads``),
``head_dim`` (default ``hidden_size // num_attention_heads``), ``num_hidden_layers``.

Rotary positions; HF applies them with ``rotate_half`` (first half / second
half of each head), Meta's original weights pair interleaved dimensions, so HF
conversions permute q/k rows within each head. This layout keeps HF's row
order (see ``loaders/layouts/__init__.py``).
Source: transformers ``models/llama/modeling_llama.py`` (``LlamaAttention``).
"""
from __future__ import annotations

from loaders.layouts import _common as C
from loaders.layouts._converters import convert_separate, hf_geometry

NAME = "llama"
PRIORITY = 35
MODEL_TYPES = frozenset({"llama", "mistral", "mixtral", "qwen2", "olmo", "granite"})
ARCHITECTURES = ("Llama", "Mistral", "Mixtral", "Qwen2", "Olmo", "Granite")

_RX = r"^(?P<p>(?:.*\.)?)layers\.(?P<i>\d+)\.self_attn\.q_proj\.weight$"


def _prefix(source, keys):
    for k in keys:
        m = C.re.match(_RX, k)
        if m and m.group("i") == "0":
            return m.group("p")
    return None


def detect(source) -> bool:
    if C.declared_other(source, MODEL_TYPES):
        return False
    keys = source.keys()
    p = _prefix(source, keys)
    return p is not None and f"{p}layers.0.self_attn.o_proj.weight" in set(keys)


def convert(source):
    g = hf_geometry(source, _RX, "{p}layers.0.self_attn.q_proj.weight", head_dim_key="head_dim")
    p, layers, d, n, dh, have = g.prefix, g.layers, g.d, g.n, g.dh, g.have
    n_kv = C.cfg_int(source, "num_key_value_heads", default=n)
    stem = p + "layers.{i}.self_attn."
    names = {r: stem + f"{r}_proj" for r in "qkvo"}
    return convert_separate(source, name=NAME, names=names, layers=layers, d=d, n=n,
                              n_kv=n_kv, dh=dh, norm="rmsnorm", positions="rotary",
                              attn_scale=None, have=have)
