"""Vision layouts on checkpoints written by ``transformers`` (tiny random models,
``save_pretrained``) and on timm keys built in code: geometry, the canonical
tensors against the model's own projection modules, ties, ``info``/``analyze``,
and the one-line error for a malformed tensor."""
from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
import transformers as tf
from safetensors.torch import save_file

from app.commands.info import describe
from loaders.checkpoints import checkpoint_from_source, open_checkpoint
from loaders.errors import CheckpointFormatError
from loaders.ingest import ingest_checkpoint
from loaders.store import Store
from loaders.tensor_source import DictSource
from tests.loaders.layout_checks import (bad_shape_error, capture, check_projections, cli, cli_json,
                                         project, randomise, reshaped)

_VISION = dict(image_size=16, patch_size=4, num_channels=3)
_HF = ("q_proj", "k_proj", "v_proj", "o_proj")
_CLIP = ("q_proj", "k_proj", "v_proj", "out_proj")

# id, model factory, module stem of layer {i} (5.x in-memory names), projection names,
# the key of layer 1's value weight on disk, expected (architecture, n_layers, n_heads, d_model, d_head)
CASES = [
    ("vit_classifier",
     lambda: tf.ViTForImageClassification(tf.ViTConfig(hidden_size=32, num_hidden_layers=2,
                                                        num_attention_heads=4, intermediate_size=64,
                                                        num_labels=3, **_VISION)),
     "vit.layers.{i}.attention.", _HF, "vit.encoder.layer.1.attention.attention.value.weight",
     ("vit", 2, 4, 32, 8)),
    ("vit_model",
     lambda: tf.ViTModel(tf.ViTConfig(hidden_size=24, num_hidden_layers=3, num_attention_heads=2,
                                      intermediate_size=48, **_VISION)),
     "layers.{i}.attention.", _HF, "encoder.layer.1.attention.attention.value.weight",
     ("vit", 3, 2, 24, 12)),
    ("deit",
     lambda: tf.DeiTForImageClassificationWithTeacher(tf.DeiTConfig(
         hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
         num_labels=3, **_VISION)),
     "deit.layers.{i}.attention.", _HF, "deit.encoder.layer.1.attention.attention.value.weight",
     ("vit", 2, 4, 32, 8)),
    ("dinov2",
     lambda: tf.Dinov2Model(tf.Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                            mlp_ratio=2, **_VISION)),
     "encoder.layer.{i}.attention.", _HF, "encoder.layer.1.attention.attention.value.weight",
     ("vit", 2, 4, 32, 8)),
    ("clip_vision",
     lambda: tf.CLIPVisionModel(tf.CLIPVisionConfig(hidden_size=32, num_hidden_layers=2,
                                                    num_attention_heads=4, intermediate_size=64,
                                                    **_VISION)),
     "encoder.layers.{i}.self_attn.", _CLIP, "encoder.layers.1.self_attn.v_proj.weight",
     ("clip", 2, 4, 32, 8)),
    ("siglip_vision",
     lambda: tf.SiglipVisionModel(tf.SiglipVisionConfig(hidden_size=32, num_hidden_layers=2,
                                                        num_attention_heads=4, intermediate_size=64,
                                                        **_VISION)),
     "encoder.layers.{i}.self_attn.", _CLIP, "encoder.layers.1.self_attn.v_proj.weight",
     ("clip", 2, 4, 32, 8)),
]
IDS = [c[0] for c in CASES]


def pixels() -> dict:
    torch.manual_seed(1)
    return {"pixel_values": torch.randn(2, 3, 16, 16)}


def names_of(stem: str, roles, i: int) -> list[str]:
    return [stem.format(i=i) + r for r in roles]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Each case's model, saved once per module: ``{id: (model, folder)}``."""
    out = {}
    for case in CASES:
        model = randomise(case[1]())
        folder = tmp_path_factory.mktemp(case[0])
        model.save_pretrained(folder, safe_serialization=True)
        out[case[0]] = (model, folder)
    return out


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_geometry_and_projections_through_saved_files(case, saved):
    cid, _, stem, roles, _, expected = case
    model, folder = saved[cid]
    last = expected[1] - 1
    cap = capture(model, names_of(stem, roles, 0) + names_of(stem, roles, last), **pixels())
    with open_checkpoint(folder) as ckpt:
        m = ckpt.meta
        assert (m.architecture, m.n_layers, m.n_heads, m.d_model, m.d_head) == expected
        assert m.n_kv_heads == m.n_heads and m.variant == "qkv"
        assert (m.norm, m.positions) == ("layernorm", "learned")
        assert m.attn_scale == pytest.approx(m.d_head ** -0.5)
        for i in (0, last):
            check_projections(ckpt.layer(i), m, cap, *names_of(stem, roles, i))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_live_state_dict_reads_the_same(case, saved):
    """transformers 5.x names the tensors differently in memory than on disk: both read alike."""
    cid = case[0]
    model, folder = saved[cid]
    live = checkpoint_from_source(DictSource(model.state_dict(), config=model.config.to_dict()))
    with open_checkpoint(folder) as disk:
        assert {**live.meta.to_json(), "config": None} == {**disk.meta.to_json(), "config": None}
        for i in range(disk.meta.n_layers):
            a, b = live.layer(i).tensors(), disk.layer(i).tensors()
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_params_counted(case, saved):
    model, folder = saved[case[0]]
    with open_checkpoint(folder) as ckpt:
        assert ckpt.meta.params_total == sum(p.numel() for p in model.parameters())
        stem = case[2].replace("{i}", r"\d+")
        attn = sum(p.numel() for name, p in model.named_parameters() if re.match(stem, name))
        assert ckpt.meta.params_attention == attn


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_bad_shape_names_key_found_and_expected(case, saved, tmp_path):
    cid, key = case[0], case[4]
    folder = shutil.copytree(saved[cid][1], tmp_path / cid)
    d, n = case[5][3], case[5][2]
    with pytest.raises(CheckpointFormatError) as exc:
        open_checkpoint(reshaped(folder, key, (d + 1, d)))
    assert str(exc.value) == (f"{folder}: layer 1 key '{key}' has shape ({d + 1}, {d}); expected ({d}, {d}) "
                              f"for d_model {d}, {n} heads of d_head {d // n}")


def test_tied_k_eq_v_read_from_the_tensors(tmp_path):
    """A ViT whose value projection is its key projection reads as k_eq_v; a random one as qkv."""
    model = randomise(CASES[0][1]())
    model.save_pretrained(tmp_path / "qkv")
    with torch.no_grad():
        for layer in model.vit.layers:
            layer.attention.v_proj.weight.copy_(layer.attention.k_proj.weight)
            layer.attention.v_proj.bias.copy_(layer.attention.k_proj.bias)
    model.save_pretrained(tmp_path / "kv")
    assert describe(str(tmp_path / "qkv"))["tied"]["variant"] == "qkv"
    tied = describe(str(tmp_path / "kv"))["tied"]
    assert tied["variant"] == "k_eq_v" and all(t["k_eq_v"] for t in tied["layers"])


# ---- CLIP and SigLIP with both towers ------------------------------------------

def clip_model(text_width: int = 24, text_heads: int = 3):
    config = tf.CLIPConfig(
        text_config=dict(hidden_size=text_width, num_hidden_layers=2, num_attention_heads=text_heads,
                         intermediate_size=48, vocab_size=64, max_position_embeddings=16),
        vision_config=dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                           intermediate_size=64, **_VISION),
        projection_dim=16)
    return randomise(tf.CLIPModel(config))


def siglip_model():
    config = tf.SiglipConfig(
        # SigLIP compares the towers' pooled outputs directly: one width, other head counts
        text_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=48,
                         vocab_size=64, max_position_embeddings=16),
        vision_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, **_VISION))
    return randomise(tf.SiglipModel(config))


TWO_TOWERS = [("clip", clip_model, "vision", (3, 4, 32, 8), (2, 3, 24, 8)),
              ("siglip", siglip_model, "vision", (2, 4, 32, 8), (2, 2, 32, 16))]


@pytest.mark.parametrize("case", TWO_TOWERS, ids=[c[0] for c in TWO_TOWERS])
def test_two_towers_numbered_vision_then_text(case, tmp_path):
    _, make, _, vision, text = case
    model = make()
    model.save_pretrained(tmp_path)
    v_layers, t_layers = vision[0], text[0]
    stems = {"vision": "vision_model.encoder.layers.{i}.self_attn.", "text": "text_model.encoder.layers.{i}.self_attn."}
    want = [n for tower, L in (("vision", v_layers), ("text", t_layers)) for i in (0, L - 1)
            for n in names_of(stems[tower], _CLIP, i)]
    torch.manual_seed(2)
    cap = capture(model, want, input_ids=torch.randint(0, 64, (2, 6)), **pixels())
    with open_checkpoint(tmp_path) as ckpt:
        m = ckpt.meta
        assert m.n_layers == v_layers + t_layers
        assert [(t.name, t.first_layer, t.n_layers, t.n_heads, t.d_model, t.d_head) for t in m.towers] == [
            ("vision", 0, *vision), ("text", v_layers, *text)]
        assert (m.n_heads, m.d_model, m.d_head) == vision[1:]          # top level: the first tower
        for tower, first, L in (("vision", 0, v_layers), ("text", v_layers, t_layers)):
            for j in (0, L - 1):
                layer = ckpt.layer(first + j)
                assert (layer.layer, layer.tower) == (first + j, tower)
                lm = m.layer_meta(first + j)
                check_projections(layer, lm, cap, *names_of(stems[tower], _CLIP, j))
        # KV bytes: each tower's layers at its own width (float32)
        assert m.kv_bytes_per_token == 2 * 4 * (v_layers * vision[1] * vision[3] + t_layers * text[1] * text[3])
        assert m.params_total == sum(p.numel() for p in model.parameters())


@pytest.mark.slow
def test_clip_info_names_both_towers(tmp_path):
    clip_model().save_pretrained(tmp_path)
    info = cli_json("info", str(tmp_path))
    assert [(t["name"], t["first_layer"], t["n_layers"], t["d_model"]) for t in info["towers"]] == [
        ("vision", 0, 3, 32), ("text", 3, 2, 24)]
    assert info["tied"]["variant"] == "qkv" and len(info["tied"]["layers"]) == 5
    rc, out, _ = cli("info", str(tmp_path))
    assert rc == 0
    assert "  tower vision         layers 0-2: 4 heads (4 kv) of d_head 8, d_model 32" in out
    assert "  tower text           layers 3-4: 3 heads (3 kv) of d_head 8, d_model 24" in out


@pytest.mark.slow
def test_clip_bad_text_tower_shape_is_one_line(tmp_path):
    clip_model().save_pretrained(tmp_path)
    key = "text_model.encoder.layers.1.self_attn.out_proj.weight"
    line = bad_shape_error(reshaped(tmp_path, key, (24, 25)))
    assert line == (f"error: {tmp_path}: layer 1 key '{key}' has shape (24, 25); expected (24, 24) "
                    "for d_model 24, 3 heads of d_head 8")


@pytest.mark.slow
def test_clip_analyze_covers_both_towers(tmp_path):
    """Towers of one geometry analyse today; each layer's rows carry its own head count."""
    clip_model(text_width=32, text_heads=4).save_pretrained(tmp_path / "clip")
    out = cli_json("analyze", str(tmp_path / "clip"), "--db", str(tmp_path / "db.duckdb"))
    rows = [r for r in out["metrics"] if r["metric"] == "kv_cka"]
    assert sorted({r["layer"] for r in rows}) == [0, 1, 2, 3, 4]
    assert all(0 <= r["value"] <= 1 for r in rows)


@pytest.mark.slow
def test_clip_analyze_towers_of_different_widths(tmp_path):
    clip_model().save_pretrained(tmp_path / "clip")
    out = cli_json("analyze", str(tmp_path / "clip"), "--db", str(tmp_path / "db.duckdb"))
    heads = {r["layer"]: r["head"] for r in out["metrics"] if r["metric"] == "kv_cka"}
    assert max(heads[3], heads[4]) == 2


def test_clip_ingest_stores_which_layer_is_which_tower(tmp_path):
    clip_model().save_pretrained(tmp_path / "clip")
    store = Store(tmp_path / "db.duckdb")
    store.migrate()
    report = ingest_checkpoint(store, tmp_path / "clip")
    with store.connect() as con:
        (towers,) = con.execute("SELECT towers FROM checkpoints WHERE id = ?", [report.checkpoint_id]).fetchone()
    assert [(t["name"], t["first_layer"], t["n_layers"]) for t in json.loads(towers)] == \
        [("vision", 0, 3), ("text", 3, 2)]


# ---- timm ------------------------------------------------------------------

def timm_state_dict(d=24, n_layers=2, seed=0, prefix=""):
    """timm ``VisionTransformer`` keys: fused qkv ``[3d, d]`` rows [q; k; v], proj ``[d, d]``."""
    g = torch.Generator().manual_seed(seed)
    sd = {f"{prefix}cls_token": torch.randn(1, 1, d, generator=g),
          f"{prefix}pos_embed": torch.randn(1, 17, d, generator=g),
          f"{prefix}patch_embed.proj.weight": torch.randn(d, 3, 4, 4, generator=g)}
    for i in range(n_layers):
        b = f"{prefix}blocks.{i}."
        sd |= {b + "norm1.weight": torch.randn(d, generator=g),
               b + "attn.qkv.weight": torch.randn(3 * d, d, generator=g),
               b + "attn.qkv.bias": torch.randn(3 * d, generator=g),
               b + "attn.proj.weight": torch.randn(d, d, generator=g),
               b + "attn.proj.bias": torch.randn(d, generator=g)}
    return sd


def timm_reference(sd, i, x, n, prefix=""):
    """timm ``Attention.forward``'s q, k, v: ``qkv(x).reshape(B, N, 3, n, dh).permute(2, 0, 3, 1, 4)``."""
    w, b = sd[f"{prefix}blocks.{i}.attn.qkv.weight"], sd[f"{prefix}blocks.{i}.attn.qkv.bias"]
    B, N, d = x.shape
    qkv = (x @ w.T + b).reshape(B, N, 3, n, d // n).permute(2, 3, 0, 1, 4)   # (3, n, B, N, dh)
    return qkv[0], qkv[1], qkv[2]


@pytest.mark.parametrize("fmt", ["safetensors", "pth", "bin"])
def test_timm_known_answer_in_each_format(fmt, tmp_path):
    sd = timm_state_dict()
    folder = tmp_path / "timm"
    folder.mkdir()
    (folder / "config.json").write_text('{"architecture": "vit_tiny_patch16_224", "num_classes": 10}')
    if fmt == "safetensors":
        save_file(sd, folder / "model.safetensors")
        path = folder
    else:
        path = tmp_path / f"vit.{fmt}"
        torch.save({"state_dict": {f"module.{k}": v for k, v in sd.items()},
                    "arch": "vit_tiny_patch16_224", "epoch": 3}, path)
    x = torch.randn(2, 5, 24)
    with open_checkpoint(path) as ckpt:
        m = ckpt.meta
        assert (m.architecture, m.n_layers, m.n_heads, m.n_kv_heads, m.d_model, m.d_head) == (
            "timm_vit", 2, 3, 3, 24, 8)
        assert m.params_attention == 2 * (3 * 24 * 24 + 3 * 24 + 24 * 24 + 24)
        for i in (0, 1):
            layer = ckpt.layer(i)
            q, k, v = timm_reference(sd, i, x, 3)
            for ref, w, b in ((q, layer.W_Q, layer.b_Q), (k, layer.W_K, layer.b_K), (v, layer.W_V, layer.b_V)):
                torch.testing.assert_close(project(x, w, b).float(), ref, atol=1e-4, rtol=1e-4)
            z = torch.randn(2, 5, 24)
            torch.testing.assert_close(
                torch.einsum("hbne,hed->bnd", z.reshape(2, 5, 3, 8).permute(2, 0, 1, 3), layer.W_O),
                z @ sd[f"blocks.{i}.attn.proj.weight"].T, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("config,heads", [({"num_heads": 4}, 4), ({"model_args": {"num_heads": 2}}, 2),
                                          ({"architecture": "vit_small_patch16_224.augreg_in21k"}, 6),
                                          ({"architecture": "deit_base_patch16_224"}, 12)])
def test_timm_head_count_sources(config, heads):
    d = 48 if heads != 12 else 96
    meta = checkpoint_from_source(DictSource(timm_state_dict(d=d), config=config)).meta
    assert (meta.n_heads, meta.d_head) == (heads, d // heads)


def test_timm_without_head_count_says_how_to_fix():
    with pytest.raises(CheckpointFormatError) as exc:
        checkpoint_from_source(DictSource(timm_state_dict(), path="vit.pth"))
    assert str(exc.value) == (
        "vit.pth: config has no head count (num_heads): a timm state dict does not record it; save it "
        "with a config.json holding num_heads or the timm architecture name "
        "(e.g. {\"architecture\": \"vit_small_patch16_224\"})")


@pytest.mark.slow
def test_timm_bad_shape_is_one_line(tmp_path):
    sd = timm_state_dict()
    sd["blocks.1.attn.qkv.weight"] = torch.zeros(70, 24)
    save_file(sd, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text('{"num_heads": 3}')
    assert bad_shape_error(tmp_path) == (
        f"error: {tmp_path}: layer 1 key 'blocks.1.attn.qkv.weight' has shape (70, 24); expected (72, 24) "
        "for d_model 24, 3 heads of d_head 8")


# ---- info and analyze on each ----------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_info_and_analyze_run(case, saved, tmp_path):
    cid, *_, expected = case
    folder = saved[cid][1]
    info = cli_json("info", str(folder))
    assert (info["architecture"], info["n_layers"], info["n_heads"], info["d_model"], info["d_head"]) == expected
    assert info["tied"]["variant"] == "qkv"
    out = cli_json("analyze", str(folder), "--db", str(tmp_path / "db.duckdb"))
    cka = [r for r in out["metrics"] if r["metric"] == "kv_cka"]
    assert len(cka) == expected[1] * expected[2] and all(0 <= r["value"] <= 1 for r in cka)


@pytest.mark.slow
def test_timm_info_and_analyze_run(tmp_path):
    save_file(timm_state_dict(), tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text('{"architecture": "vit_tiny_patch16_224"}')
    assert cli_json("info", str(tmp_path))["n_heads"] == 3
    out = cli_json("analyze", str(tmp_path), "--db", str(tmp_path.parent / "t.duckdb"))
    assert {r["layer"] for r in out["metrics"]} == {0, 1}


def test_tower_prefixed_one_tower_checkpoint_reads_as_unprefixed(saved):
    """A SigLIP/CLIP vision model saved with its ``vision_model.`` prefix (transformers 4.x) and
    the top-level vision config reads like the prefix-less 5.x file."""
    model, folder = saved["siglip_vision"]
    sd = {f"vision_model.{k}": v for k, v in model.state_dict().items()}
    prefixed = checkpoint_from_source(DictSource(sd, config=model.config.to_dict()))
    with open_checkpoint(folder) as bare:
        assert [t.name for t in prefixed.meta.towers] == [t.name for t in bare.meta.towers] == ["vision"]
        assert torch.equal(prefixed.layer(1).W_V, bare.layer(1).W_V)


def test_layer_meta_is_the_meta_itself_for_one_geometry(saved):
    with open_checkpoint(saved["vit_model"][1]) as ckpt:
        assert ckpt.meta.tower_of(0) is None and ckpt.meta.layer_meta(2) is ckpt.meta
    model = clip_model(text_width=32, text_heads=4)
    clip = checkpoint_from_source(DictSource(model.state_dict(), config=model.config.to_dict()))
    assert clip.meta.tower_of(4).name == "text" and clip.meta.layer_meta(4) is clip.meta
    other = clip_model()
    clip = checkpoint_from_source(DictSource(other.state_dict(), config=other.config.to_dict()))
    text = clip.meta.layer_meta(3)
    assert (text.n_heads, text.d_model, text.d_head, text.n_layers) == (3, 24, 8, 5)


def test_siglip2_vision_tower(tmp_path):
    """SigLIP 2 keeps SigLIP's attention names (its patch embedding differs, not read here)."""
    model = randomise(tf.Siglip2VisionModel(tf.Siglip2VisionConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, patch_size=4,
        num_channels=3)))
    model.save_pretrained(tmp_path)
    with open_checkpoint(tmp_path) as ckpt:
        m = ckpt.meta
        assert (m.architecture, m.n_layers, m.n_heads, m.d_head, [t.name for t in m.towers]) == (
            "clip", 2, 4, 8, ["vision"])
        attn = model.encoder.layers[1].self_attn
        layer = ckpt.layer(1)
        for h in range(4):
            rows = slice(8 * h, 8 * (h + 1))
            assert torch.equal(layer.W_Q[h], attn.q_proj.weight[rows].T)
            assert torch.equal(layer.W_V[h], attn.v_proj.weight[rows].T)
            assert torch.equal(layer.W_O[h], attn.out_proj.weight[:, rows].T)
