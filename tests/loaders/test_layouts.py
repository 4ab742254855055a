"""Every layout transformers can build: tiny random model -> canonical weights ->
layer 0's attention recomputed by hand must match the library's.

Independent of the converters' own reshapes: the reference is what the library
computes (eager attention probabilities from ``output_attentions`` and the
output projection's result, captured by hooks). Rotary models run with all
``position_ids = 0``, where every rotation is the identity, so their
probabilities are plain ``softmax(scale * q k^T)`` as well.
"""
from __future__ import annotations

import pytest
import torch
import transformers as tf

from loaders.checkpoints import checkpoint_from_source, open_checkpoint
from loaders.tensor_source import DictSource

T = 6  # tokens

# name, config factory, model class, fused/q module suffix, out module suffix,
# expected (architecture, n_kv_heads), causal, rotary
_COMMON = dict(vocab_size=64)
CASES = [
    ("gpt2", lambda: tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=16, **_COMMON),
     tf.GPT2LMHeadModel, "h.0.attn.c_attn", "h.0.attn.c_proj", ("gpt2", 4), True, False),
    ("llama_gqa", lambda: tf.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=64,
                                         max_position_embeddings=16, **_COMMON),
     tf.LlamaForCausalLM, "layers.0.self_attn.q_proj", "layers.0.self_attn.o_proj", ("llama", 2),
     True, True),
    ("mistral", lambda: tf.MistralConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=64,
                                         max_position_embeddings=16, **_COMMON),
     tf.MistralForCausalLM, "layers.0.self_attn.q_proj", "layers.0.self_attn.o_proj",
     ("llama", 2), True, True),
    ("qwen2", lambda: tf.Qwen2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, intermediate_size=64,
                                     max_position_embeddings=16, **_COMMON),
     tf.Qwen2ForCausalLM, "layers.0.self_attn.q_proj", "layers.0.self_attn.o_proj",
     ("llama", 2), True, True),
    ("neox", lambda: tf.GPTNeoXConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=64, max_position_embeddings=16, **_COMMON),
     tf.GPTNeoXForCausalLM, "layers.0.attention.query_key_value", "layers.0.attention.dense",
     ("neox", 4), True, True),
    ("bert", lambda: tf.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=64, max_position_embeddings=16, **_COMMON),
     tf.BertModel, "layer.0.attention.self.query", "layer.0.attention.output.dense",
     ("bert", 4), False, False),
    ("phi3", lambda: tf.Phi3Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=64,
                                   max_position_embeddings=16, pad_token_id=0, bos_token_id=1,
                                   eos_token_id=2, **_COMMON),
     tf.Phi3ForCausalLM, "layers.0.self_attn.qkv_proj", "layers.0.self_attn.o_proj",
     ("phi3", 2), True, True),
    ("falcon_new_arch", lambda: tf.FalconConfig(hidden_size=32, num_hidden_layers=2,
                                                num_attention_heads=4, num_kv_heads=2,
                                                new_decoder_architecture=True, bias=True,
                                                **_COMMON),
     tf.FalconForCausalLM, "h.0.self_attention.query_key_value", "h.0.self_attention.dense",
     ("falcon", 2), True, True),
    ("falcon_mqa", lambda: tf.FalconConfig(hidden_size=32, num_hidden_layers=2,
                                           num_attention_heads=4, multi_query=True,
                                           new_decoder_architecture=False, **_COMMON),
     tf.FalconForCausalLM, "h.0.self_attention.query_key_value", "h.0.self_attention.dense",
     ("falcon", 1), True, True),
    ("falcon_mha", lambda: tf.FalconConfig(hidden_size=32, num_hidden_layers=2,
                                           num_attention_heads=4, multi_query=False,
                                           new_decoder_architecture=False, bias=True, **_COMMON),
     tf.FalconForCausalLM, "h.0.self_attention.query_key_value", "h.0.self_attention.dense",
     ("falcon", 4), True, True),
    ("opt", lambda: tf.OPTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                 ffn_dim=64, max_position_embeddings=16, word_embed_proj_dim=32,
                                 **_COMMON),
     tf.OPTForCausalLM, "layers.0.self_attn.q_proj", "layers.0.self_attn.out_proj", ("opt", 4),
     True, False),
    ("gptj", lambda: tf.GPTJConfig(n_embd=32, n_layer=2, n_head=4, n_positions=16, rotary_dim=4,
                                   **_COMMON),
     tf.GPTJForCausalLM, "h.0.attn.q_proj", "h.0.attn.out_proj", ("gptj", 4), True, True),
]
IDS = [c[0] for c in CASES]


def _module(model, suffix):
    hits = [m for name, m in model.named_modules() if name.endswith(suffix)]
    assert len(hits) == 1, f"{suffix}: {len(hits)} modules"
    return hits[0]


def build(case, seed=0):
    """A tiny random model whose every parameter (biases and norms too) is non-trivial."""
    _, make_config, cls, *_ = case
    torch.manual_seed(seed)
    config = make_config()
    model = cls._from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model


def reference(model, case):
    """Run the library: the input of layer 0's attention, its probabilities and
    the output projection's result."""
    _, _, _, in_suffix, out_suffix, _, _, rotary = case
    seen = {}

    def keep(name, pick):
        def hook(module, inp, out):
            seen.setdefault(name, pick(inp, out).detach().clone())   # returns None: output unchanged
        return hook

    h1 = _module(model, in_suffix).register_forward_hook(keep("x", lambda i, o: i[0]))
    h2 = _module(model, out_suffix).register_forward_hook(keep("out", lambda i, o: o))
    torch.manual_seed(1)
    ids = torch.randint(0, 64, (2, T))
    kwargs = dict(output_attentions=True)
    if rotary:
        kwargs["position_ids"] = torch.zeros(2, T, dtype=torch.long)
    with torch.no_grad():
        res = model(input_ids=ids, **kwargs)
    h1.remove()
    h2.remove()
    return seen["x"], res.attentions[0], seen["out"]


def recompute(ckpt, x, causal):
    """probs[b, h] = softmax(scale * q_h k_g^T), g = h // (n/n_kv); out = sum_h z_h W_O[h] + b_O."""
    meta, L = ckpt.meta, ckpt.layer(0)
    x = x.double()
    group = meta.n_heads // meta.n_kv_heads
    probs, out = [], 0
    for h in range(meta.n_heads):
        g = h // group
        q = x @ L.W_Q[h].double() + (0 if L.b_Q is None else L.b_Q[h].double())
        k = x @ L.W_K[g].double() + (0 if L.b_K is None else L.b_K[g].double())
        v = x @ L.W_V[g].double() + (0 if L.b_V is None else L.b_V[g].double())
        logits = meta.attn_scale * q @ k.transpose(-1, -2)               # (B, T, T)
        if causal:
            logits = logits.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf"))
        p = logits.softmax(-1)
        probs.append(p)
        out = out + (p @ v) @ L.W_O[h].double()                           # (B, T, d)
    if L.b_O is not None:
        out = out + L.b_O.double()
    return torch.stack(probs, 1), out


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_layer0_matches_library(case):
    model = build(case)
    x, probs_ref, out_ref = reference(model, case)
    source = DictSource(model.state_dict(), config=model.config.to_dict())
    with checkpoint_from_source(source) as ckpt:
        arch, n_kv = case[5]
        assert (ckpt.meta.architecture, ckpt.meta.n_kv_heads) == (arch, n_kv)
        assert (ckpt.meta.n_layers, ckpt.meta.n_heads, ckpt.meta.d_model) == (2, 4, 32)
        probs, out = recompute(ckpt, x, causal=case[6])
    torch.testing.assert_close(probs.float(), probs_ref.float(), atol=1e-4, rtol=0)
    torch.testing.assert_close(out.float(), out_ref.float(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_params_counted(case):
    model = build(case)
    source = DictSource(model.state_dict(), config=model.config.to_dict())
    meta = checkpoint_from_source(source).meta
    n_params = sum(p.numel() for p in model.parameters())  # tied parameters counted once
    assert meta.params_total == n_params
    attn = sum(p.numel() for name, p in model.named_parameters()
               if any(s in name for s in ("attn.", "attention.", "self_attn.", "self_attention."))
               and not any(s in name for s in ("norm", "LayerNorm", "ln_")))
    assert meta.params_attention == attn


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_through_saved_files(case, tmp_path):
    """The same check through ``save_pretrained`` and ``open_checkpoint``."""
    model = build(case)
    x, probs_ref, _ = reference(model, case)
    model.save_pretrained(tmp_path)
    with open_checkpoint(tmp_path) as ckpt:
        assert ckpt.meta.architecture == case[5][0]
        probs, _ = recompute(ckpt, x, causal=case[6])
    torch.testing.assert_close(probs.float(), probs_ref.float(), atol=1e-4, rtol=0)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_tensors_read_from_a_file_share_no_memory(case, tmp_path):
    """Through safetensors files (read with preadv into memory of each read's own, which the
    converters then hand out without a copy: ``loaders.private_tensors``), the layer's
    tensors still share no memory with each other, and modifying them changes nothing a
    later read sees."""
    model = build(case)
    model.save_pretrained(tmp_path)
    with open_checkpoint(tmp_path) as ckpt:
        layer = ckpt.layer(0)
        ts = {n: t for n, t in layer.tensors().items() if t is not None and t.is_floating_point() and t.numel()}
        spans = sorted((t.untyped_storage().data_ptr(), t.untyped_storage().data_ptr() + t.untyped_storage().nbytes())
                       for t in ts.values())
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), spans
        before = {n: t.clone() for n, t in ts.items()}
        for t in ts.values():
            t.add_(1.0)
        again = ckpt.layer(0).tensors()
        assert all(torch.equal(again[n], v) for n, v in before.items())


def test_converted_tensors_are_fresh():
    """Modifying a converted layer leaves the source's tensors untouched."""
    model = build(CASES[0])
    sd = model.state_dict()
    before = {k: v.clone() for k, v in sd.items()}
    ckpt = checkpoint_from_source(DictSource(sd, config=model.config.to_dict()))
    layer = ckpt.layer(0)
    for t in layer.tensors().values():
        t.add_(1.0)
    assert all(torch.equal(sd[k], before[k]) for k in sd)
