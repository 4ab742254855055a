"""Random attention-only Hugging Face Llama folders for the benchmarks (not a benchmark itself).

``build(folder, shape)`` writes ``config.json`` and ``shape.shards`` safetensors
shards (``model-0000i-of-0000n.safetensors`` with ``model.safetensors.index.json``
when more than one) holding only each layer's ``q/k/v/o_proj.weight``, random
bfloat16 ``N(0, 0.02^2)``: what the weight analysis reads of a real checkpoint
of that geometry (MLPs and embeddings left out). Layers are spread over the
shards in order, as ``transformers`` saves them.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Shape:
    name: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    shards: int = 1

    def attention_bytes(self) -> int:
        """Bytes of bfloat16 attention weights (the folder's size, near enough)."""
        q = self.n_heads * self.d_head * self.d_model
        kv = self.n_kv_heads * self.d_head * self.d_model
        return 2 * self.n_layers * (2 * q + 2 * kv)

    def with_(self, **kw) -> "Shape":
        return Shape(**{**self.__dict__, **kw})


#: TinyLlama-1.1B's attention: 22 layers, d_model 2048, 32 heads, 4 kv heads (0.4 GB).
LLAMA_1B = Shape("1.1B", 22, 2048, 32, 4, 64)
#: Llama-2-7B's attention: 32 layers, d_model 4096, 32 heads MHA (4.3 GB in 4 shards).
LLAMA_7B = Shape("7B", 32, 4096, 32, 32, 128, shards=4)
#: A smoke run's shape (``bench/run_all.py --quick``): 1 layer, d_model 256, 4 heads, 2 kv heads,
#: d_head 64 (0.4 MB): every phase runs, in seconds, its figures fixed costs.
TINY = Shape("tiny", 1, 256, 4, 2, 64)


def build(folder: Path, shape: Shape, *, seed: int = 0) -> Path:
    """Write the folder (kept if its config already matches ``shape``); returns it."""
    import torch
    from safetensors.torch import save_file

    folder = Path(folder)
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": shape.d_model,
              "num_attention_heads": shape.n_heads, "num_key_value_heads": shape.n_kv_heads,
              "head_dim": shape.d_head, "num_hidden_layers": shape.n_layers,
              "intermediate_size": 4 * shape.d_model, "vocab_size": 32000, "torch_dtype": "bfloat16"}
    cfg = folder / "config.json"
    if cfg.exists() and json.loads(cfg.read_text()) == config:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("model*.safetensors*"):
        old.unlink()
    g = torch.Generator().manual_seed(seed)
    n = max(1, shape.shards)
    per = -(-shape.n_layers // n)
    index = {}
    hd, kvd, d = shape.n_heads * shape.d_head, shape.n_kv_heads * shape.d_head, shape.d_model
    for s in range(n):
        name = "model.safetensors" if n == 1 else f"model-{s + 1:05d}-of-{n:05d}.safetensors"
        sd = {}
        for i in range(s * per, min(shape.n_layers, (s + 1) * per)):
            p = f"model.layers.{i}.self_attn."
            for proj, rows, cols in (("q", hd, d), ("k", kvd, d), ("v", kvd, d), ("o", d, hd)):
                sd[p + f"{proj}_proj.weight"] = (torch.randn(rows, cols, generator=g) * 0.02).to(torch.bfloat16)
                index[p + f"{proj}_proj.weight"] = name
        save_file(sd, str(folder / name))
        del sd
    if n > 1:
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": shape.attention_bytes()}, "weight_map": index}))
    cfg.write_text(json.dumps(config))
    os.sync()            # written out now, not while a phase is timed
    return folder
