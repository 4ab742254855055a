"""experiments.runnable: which modules are a model's attention layers, which stacks a vision
model has, how many positions it takes, and feed's batches and hooks (toy models built here)."""
from __future__ import annotations

import types

import pandas as pd
import pytest
import torch
from torch import nn

from analysis.captures import MAX_WINDOW
from analysis.registry import RESULT_COLUMNS
from experiments import runnable
from loaders.canonical import ModelMeta, Tower


class SelfAttention(nn.Module):          # nested inside an outer *Attention: not a layer of its own
    def forward(self, x):
        return x


class BlockAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = SelfAttention()

    def forward(self, hidden_states):
        return self.inner(hidden_states)


class Toy(nn.Module):
    def __init__(self, n=3, pool=False):
        super().__init__()
        self.blocks = nn.ModuleList(BlockAttention() for _ in range(n))
        self.emb = nn.Embedding(10, 4)
        if pool:
            self.head = nn.MultiheadAttention(4, 1)

    def forward(self, ids):
        x = self.emb(ids)
        for b in self.blocks:
            x = b(hidden_states=x)       # as keyword: the hook reads kwargs["hidden_states"]
        return x


def test_attention_modules_are_the_outermost_in_layer_order():
    toy = Toy(pool=True)
    assert runnable.attention_modules(toy) == [*toy.blocks, toy.head]
    assert runnable.stack_modules(toy) == list(toy.blocks)            # the pooling head is no layer


def test_hf_towers_only_for_transformers_models():
    assert runnable.hf_towers(Toy()) is None
    import transformers as T

    vit = T.ViTModel(T.ViTConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8,
                                 image_size=8, patch_size=4))
    assert runnable.hf_towers(vit) == [(None, vit, "images")]
    gpt = T.GPT2Model(T.GPT2Config(n_embd=8, n_layer=1, n_head=2, vocab_size=16, n_positions=8))
    assert runnable.hf_towers(gpt) is None


def test_tower_layers():
    meta = ModelMeta(architecture="clip", variant="qkv", n_layers=5, n_heads=2, n_kv_heads=2, d_model=8, d_head=4,
                     norm="layernorm", positions="learned", attn_scale=0.5, dtype="float32", params_total=0,
                     params_attention=0, towers=(Tower("vision", 0, 3, 2, 2, 8, 4), Tower("text", 3, 2, 2, 2, 8, 4)))
    assert runnable.tower_layers(meta, None) == [0, 1, 2, 3, 4]
    assert runnable.tower_layers(meta, "text") == [3, 4]
    with pytest.raises(runnable.NoForwardPass, match="the model has a audio tower but the checkpoint's layout"):
        runnable.tower_layers(meta, "audio")


def test_model_context():
    own = types.SimpleNamespace(cfg=types.SimpleNamespace(positions="learned", block_size=64))
    assert runnable.model_context(own) == 64
    assert runnable.model_context(types.SimpleNamespace(cfg=types.SimpleNamespace(positions="rotary"))) == MAX_WINDOW
    assert runnable.model_context(types.SimpleNamespace(context_limit=32, cfg=None)) == 32
    hf = types.SimpleNamespace(config=types.SimpleNamespace(n_positions=77))
    assert runnable.model_context(hf) == 77
    assert runnable.model_context(types.SimpleNamespace()) == MAX_WINDOW


class Recorder:
    """An accumulator that records the shapes it is handed and returns one row."""

    def __init__(self, layer):
        self.layer, self.shapes = layer, []

    def add(self, x):
        self.shapes.append(tuple(x.shape))

    def result(self):
        row = dict(layer=self.layer, head=0, head_label=f"L{self.layer}H0", metric="kv_cosine_act",
                   value=float("nan") if self.layer == 1 else 0.5, chance=0.0, n_tokens=1, ci_low=0.0, ci_high=1.0)
        return pd.DataFrame([row], columns=RESULT_COLUMNS), {"kv_cka_act": f"note of layer {self.layer}"}


def test_feed_batches_hooks_and_notes(monkeypatch):
    monkeypatch.setattr(runnable, "BATCH_TOKENS", 20)                  # 20 // 8 = 2 windows a batch
    toy = Toy()
    accs = [Recorder(i) for i in range(3)]
    seen = []
    frame, notes = runnable.feed(toy, list(toy.blocks), accs, torch.zeros(5, 8, dtype=torch.long), 8, "cpu",
                                 lambda d, n, w: seen.append((d, n, w)), "windows")
    assert [a.shapes for a in accs] == [[(2, 8, 4), (2, 8, 4), (1, 8, 4)]] * 3
    assert seen[0] == (0, 5, "activations: windows 1-2 of 5") and seen[-1] == (5, 5, "activations done")
    assert list(frame.layer) == [0, 1, 2] and list(frame.columns) == RESULT_COLUMNS
    assert notes == {"kv_cka_act": "note of layer 0", "kv_cosine_act": "undefined (zero norm or singular matrix) at L1H0"}
    assert all(not b._forward_pre_hooks for b in toy.blocks)            # the hooks are removed


class Headed(Toy):
    """Toy with a final norm and an output head after its attention blocks, counting the calls
    that reach each block and the head."""

    def __init__(self):
        super().__init__()
        self.norm, self.head_out = nn.LayerNorm(4), nn.Linear(4, 10)
        self.reached = {"blocks": 0, "head": 0}
        for b in self.blocks:
            b.register_forward_hook(lambda *_: self.reached.__setitem__("blocks", self.reached["blocks"] + 1))

    def forward(self, ids):
        x = super().forward(ids)
        self.reached["head"] += 1
        return self.head_out(self.norm(x))


class Adder(Recorder):
    """A Recorder that also keeps what it was handed."""

    def __init__(self, layer):
        super().__init__(layer)
        self.xs = []

    def add(self, x):
        super().add(x)
        self.xs.append(x.clone())


def test_feed_stops_each_batch_at_the_last_attention_input(monkeypatch):
    """The forward after the last attention module's input (that block, the final norm, the
    head) feeds nothing and is not run; every layer gets the same inputs as in a whole forward."""
    monkeypatch.setattr(runnable, "BATCH_TOKENS", 16)                  # 16 // 8 = 2 windows a batch
    toy = Headed()
    ids = torch.randint(0, 10, (5, 8), generator=torch.Generator().manual_seed(0))
    accs = [Adder(i) for i in range(3)]
    runnable.feed(toy, list(toy.blocks), accs, ids, 8, "cpu", None, "windows")
    assert toy.reached == {"blocks": 2 * 3, "head": 0}                 # 3 batches; the last block never runs
    want = {i: [] for i in range(3)}                                   # a whole forward, hooks of our own
    hooks = [b.register_forward_pre_hook(lambda m, a, kw, i=i: want[i].append(kw["hidden_states"].clone()),
                                         with_kwargs=True) for i, b in enumerate(toy.blocks)]
    with torch.inference_mode():
        for lo in range(0, 5, 2):
            toy(ids[lo:lo + 2])
    for h in hooks:
        h.remove()
    assert toy.reached["head"] == 3
    for i, acc in enumerate(accs):
        assert len(acc.xs) == 3 and all(torch.equal(a, b) for a, b in zip(acc.xs, want[i])), i
    assert all(not b._forward_pre_hooks for b in toy.blocks)


def test_feed_hands_no_input_past_the_stop_and_runs_whole_when_a_layer_is_not_reached():
    """A model that catches the stop and goes on calls the hooks again: nothing more is added.
    A batch that never reaches one attention module runs to its end."""
    class Catching(Headed):
        def forward(self, ids):
            try:
                return super().forward(ids)
            except Exception:                                           # noqa: BLE001  a model's own handler
                return super().forward(ids)

    toy = Catching()
    accs = [Adder(i) for i in range(3)]
    runnable.feed(toy, list(toy.blocks), accs, torch.zeros(2, 8, dtype=torch.long), 8, "cpu", None, "windows")
    assert [len(a.xs) for a in accs] == [1, 1, 1]
    toy = Headed()
    accs = [Adder(i) for i in range(4)]                                # a fourth module the model never calls
    extra = BlockAttention()
    runnable.feed(toy, [*toy.blocks, extra], accs, torch.zeros(2, 8, dtype=torch.long), 8, "cpu", None, "windows")
    assert toy.reached == {"blocks": 3, "head": 1} and [len(a.xs) for a in accs] == [1, 1, 1, 0]
