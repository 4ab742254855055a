"""Model geometry presets for the serving-cost calculator, each with its source.

Figures are the models' published configurations (Hugging Face ``config.json``
of the named repository, or the papers' code); parameter counts follow from
them through :func:`analysis.kv_cost.formula_params` and are checked against
``transformers`` models built from the same configurations
(``tests/analysis/test_kv_cost.py``).
"""
from __future__ import annotations

from analysis.errors import AnalysisError
from analysis.kv_cost import Geometry
from analysis.kv_layers import layer_types_from_config


def _gpt2(name: str, layers: int, d: int, heads: int, repo: str) -> Geometry:
    return Geometry(name=name, n_layers=layers, n_heads=heads, n_kv_heads=heads, d_model=d,
                    d_head=d // heads, d_mlp=4 * d, mlp="gelu", vocab=50257, n_positions=1024,
                    tied_embeddings=True, bias=True, norm="layernorm",
                    source=f"Hugging Face {repo} config.json (Radford et al. 2019)")


def _llama(name: str, layers: int, d: int, heads: int, kv: int, d_mlp: int, vocab: int, repo: str,
           **extra) -> Geometry:
    return Geometry(name=name, n_layers=layers, n_heads=heads, n_kv_heads=kv, d_model=d, d_head=d // heads,
                    d_mlp=d_mlp, mlp="gated", vocab=vocab, n_positions=0, tied_embeddings=False,
                    bias=False, norm="rmsnorm", source=f"Hugging Face {repo} config.json", **extra)


def _gemma(name: str, repo: str, config: dict) -> Geometry:
    """A Gemma 2/3 text model from its config.json fields (tied embeddings, gated GELU MLP,
    RMSNorm; the formula counts two norms a layer where Gemma has four, and no QK-norm)."""
    return Geometry(name=name, n_layers=config["num_hidden_layers"], n_heads=config["num_attention_heads"],
                    n_kv_heads=config["num_key_value_heads"], d_model=config["hidden_size"],
                    d_head=config["head_dim"], d_mlp=config["intermediate_size"], mlp="gated",
                    vocab=config["vocab_size"], n_positions=0, tied_embeddings=True, bias=False, norm="rmsnorm",
                    sliding_window=config["sliding_window"], layer_types=layer_types_from_config(config),
                    source=f"Hugging Face {repo} config.json")


PRESETS: dict[str, Geometry] = {g.name: g for g in (
    _gpt2("gpt2", 12, 768, 12, "openai-community/gpt2"),
    _gpt2("gpt2-medium", 24, 1024, 16, "openai-community/gpt2-medium"),
    _gpt2("gpt2-large", 36, 1280, 20, "openai-community/gpt2-large"),
    _gpt2("gpt2-xl", 48, 1600, 25, "openai-community/gpt2-xl"),
    _llama("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, "meta-llama/Llama-2-7b-hf"),
    _llama("llama-2-13b", 40, 5120, 40, 40, 13824, 32000, "meta-llama/Llama-2-13b-hf"),
    _llama("llama-2-70b", 80, 8192, 64, 8, 28672, 32000, "meta-llama/Llama-2-70b-hf"),
    _llama("llama-3-8b", 32, 4096, 32, 8, 14336, 128256, "meta-llama/Meta-Llama-3-8B"),
    _llama("llama-3-70b", 80, 8192, 64, 8, 28672, 128256, "meta-llama/Meta-Llama-3-70B"),
    _llama("mistral-7b", 32, 4096, 32, 8, 14336, 32000, "mistralai/Mistral-7B-v0.1",
           sliding_window=4096),
    _llama("qwen2-7b", 28, 3584, 28, 4, 18944, 152064, "Qwen/Qwen2-7B", qkv_bias=True),
    # hybrid stacks: sliding-window layers priced by their window (analysis.kv_layers)
    _gemma("gemma-2-9b", "google/gemma-2-9b", {
        "model_type": "gemma2", "num_hidden_layers": 42, "hidden_size": 3584, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 256, "intermediate_size": 14336, "vocab_size": 256000,
        "sliding_window": 4096}),
    _gemma("gemma-3-27b", "google/gemma-3-27b-it (text_config)", {
        "model_type": "gemma3_text", "num_hidden_layers": 62, "hidden_size": 5376, "num_attention_heads": 32,
        "num_key_value_heads": 16, "head_dim": 128, "intermediate_size": 21504, "vocab_size": 262208,
        "sliding_window": 1024, "sliding_window_pattern": 6}),
    Geometry(name="query-free-124m", n_layers=12, n_heads=12, n_kv_heads=12, d_model=768, d_head=64,
             d_mlp=3072, mlp="gelu", vocab=50304, n_positions=1024, tied_embeddings=True, bias=False,
             norm="layernorm", variant="wq_identity",
             source="query-free attention, arXiv 2510.23912; MarkoKarbevski/Wqkv_necessity "
                    "(nanoGPT GPT-2 small: block 1024, vocab 50304, bias False, tied weights)"),
    Geometry(name="projection-sharing-300m", n_layers=20, n_heads=16, n_kv_heads=16, d_model=1024,
             d_head=64, d_mlp=4096, mlp="gelu", vocab=50304, n_positions=2048, tied_embeddings=True,
             bias=True, norm="layernorm", variant="qkv",
             source="projection sharing, arXiv 2606.04032; Brainchip-Inc/Do-Transformers-Need-3-Projections "
                    "hf_model_card_llm (n_layer 20, n_embd 1024, n_head 16, n_inner 4096, n_positions 2048, "
                    "vocab 50304, tied; 284.5M parameters for K=V)"),
    Geometry(name="projection-sharing-1.2b", n_layers=22, n_heads=32, n_kv_heads=32, d_model=2048,
             d_head=64, d_mlp=8192, mlp="gelu", vocab=50304, n_positions=2048, tied_embeddings=True,
             bias=True, norm="layernorm", variant="qkv",
             source="projection sharing, arXiv 2606.04032 (22 layers, d_model 2048, 32 heads, MLP 8192, "
                    "vocab 50304); positions, biases and tying assumed as in its 300M model"),
)}


def get_preset(name: str) -> Geometry:
    """The preset ``name`` (case-insensitive); AnalysisError lists the known names."""
    key = name.strip().lower()
    if key not in PRESETS:
        raise AnalysisError(f"unknown preset {name!r}: expected one of {', '.join(PRESETS)}")
    return PRESETS[key]
