"""What would sharing cost this model? Convert a trained checkpoint to a tied or shared attention
and measure its loss on the same tokens before and after.

Targets (--to) and methods (--method; the first is the default); formulas and sources in
``analysis.conversion``, prose in docs/whatif.md:

  k_eq_v        lstsq (W_V := W_K, W_O[h] := T W_O[h], T the ridge fit K -> V on the layer's
                input), keep_k, keep_v, avg                               (one cached tensor)
  wq_identity   basis: the residual stream moved to one basis M (no norm: the mean stacked W_Q,
                exact for one layer or a shared W_Q; RMSNorm/LayerNorm: its orthogonal polar
                factor after folding the gains), each head's query block folded into its key;
                notes give per layer the share of the query factor dropped (query-free paper,
                arXiv 2510.23912; SliceGPT arXiv 2401.15024)
  q_eq_k        psd (best PSD rank-d_head map to the symmetric part of W_Q W_K^T), keep_q,
                keep_k, avg
  q_eq_k_eq_v   A+B: q_eq_k by A, then k_eq_v by B (default psd+lstsq)
  gqa:G, mqa    mean (Ainslie et al. 2023, arXiv 2305.13245), aligned (orthogonal Procrustes
                before pooling, W_Q and W_O re-mapped; arXiv 2412.20677)
  latent:R      svd: joint activation-aware rank-R SVD of [W_K | W_V], R numbers cached per
                token and layer (MHA2MLA-style, arXiv 2502.14837)

--layers greedy converts one layer at a time, each step the layer whose conversion costs least
on a quarter of the evaluation windows, and reports the curve (KV bytes per token against
perplexity). The sample text is cut into windows alternating between evaluation (every loss)
and fit (the fitted methods, healing): no conversion is scored on the tokens it was fitted on.
ci_low/ci_high: exp of the 95% t interval (n - 1 df) of the mean loss over evaluation windows.

Runs on checkpoints built as this project's GPT (its own variants, nanoGPT and forks,
llama2.c / Meta Llama, the query-free and projection-sharing papers' models) and on Hugging Face
GPT-2, GPT-NeoX and Llama-style causal LMs (Llama, Mistral, Qwen2, Gemma: converted in place, not
healed or saved). With --images: this project's ViT and Hugging Face ViT classifiers, measured by
classification loss and accuracy on the images (not saved). The file is opened in a child process
under the analysis budgets (``loaders.sandbox``, job ``whatif``), as
``analyze`` does; nothing is unpickled and no model code from a file runs.

Examples:
  python -m app whatif data/demo/qkv-mha-wd0.1/checkpoints/final_step_004000.safetensors --to k_eq_v
  python -m app whatif ckpt.pt --to mqa --method aligned --layers greedy --json
  python -m app whatif ckpt.pt --to gqa:2 --heal-steps 200 --heal distill --out converted/
  python -m app whatif data/demo/vit-qkv-mha-wd0.1/checkpoints/final_step_000300.safetensors --to mqa --images digits
"""
from __future__ import annotations

import argparse
from pathlib import Path

from app.commands._common import print_json
from loaders.report import shown

NAME = "whatif"
HELP = "what would sharing cost this model? convert a checkpoint to K=V, Q=K, W_Q=I, GQA/MQA or a latent cache"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="PATH_OR_ID", help="checkpoint file or folder, or a stored checkpoint id")
    p.add_argument("--to", required=True, metavar="TARGET",
                   help="k_eq_v, q_eq_k, q_eq_k_eq_v, wq_identity, gqa:G (G kv heads), mqa or latent:R "
                        "(R cached numbers per token and layer)")
    p.add_argument("--method", metavar="M", help="conversion method (see above; default: the target's first)")
    p.add_argument("--grouping", choices=("contiguous", "best"), default="contiguous",
                   help="gqa:G: pool contiguous runs of kv heads (default), or per layer the free grouping of "
                        "least mean-pool residual of W_K (analysis.head_grouping; notes.grouping gives the groups)")
    p.add_argument("--layers", default="all", metavar="all|greedy|L,L,...",
                   help="all layers converted at once (default); greedy: one at a time, cheapest first, "
                        "a step each (the curve); or the layer numbers L,L,... (from 0) converted at once")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--text", metavar="FILE", help="text file or folder to measure on (default: the bundled corpus)")
    src.add_argument("--images", metavar="DATASET",
                     help="vision models: 'digits' (scikit-learn's bundled 8x8 digits), an .npz with x and y, or "
                          "a folder of class folders; loss = classification cross-entropy per image, ppl = "
                          "exp(loss), accuracy with its interval in notes")
    p.add_argument("--tokens", type=int, metavar="N",
                   help="evaluation tokens (default max(4096, 8 d_head); as many again are fitted on; at least "
                        "one context window each; images: this many tokens' worth of whole images)")
    p.add_argument("--heal-steps", type=int, default=0, metavar="N",
                   help="fine-tune the converted model N steps with the tie kept, then evaluate again "
                        "(healed: loss before surgery, after surgery, after healing)")
    p.add_argument("--heal", choices=("distill", "lm"),
                   help="healing loss, with --heal-steps: distill (KL to the original model, default) or lm "
                        "(next-token loss)")
    p.add_argument("--out", metavar="DIR", help="write the converted checkpoint (model.safetensors + config.json), "
                                                "which info reads back as the new variant")
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when there is one")
    p.add_argument("--db", help="database file, to read a stored checkpoint id (default: the usual one)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: checkpoint, target, method, sample, baseline, steps, healed, "
                        "notes (docs/whatif.md)")


def compute(path: str, **kwargs) -> dict:
    """``experiments.whatif.whatif`` on the checkpoint at ``path``: the body run in the child."""
    from experiments.runnable import NoForwardPass   # here: torch loads in the child only
    from experiments.sample_text import SampleSpec
    from experiments.whatif import whatif
    from loaders.checkpoints import open_checkpoint
    from loaders.errors import QkvscopeError

    sample = SampleSpec(kwargs.pop("text"), kwargs.pop("tokens"))
    images = kwargs.pop("images", None)
    with open_checkpoint(path) as ckpt:
        try:
            return whatif(ckpt, sample=sample, images=images, **kwargs)
        except NoForwardPass as exc:
            raise QkvscopeError(str(exc).removeprefix(f"{path}: ")) from None


def _path(args) -> str:
    """``PATH_OR_ID``: an existing path as given, else a stored checkpoint's path."""
    if Path(args.path).expanduser().exists():
        return str(Path(args.path).expanduser())
    from loaders.errors import StoreError        # here: the store opens only for a checkpoint id
    from loaders.store import Store

    try:
        cid = int(args.path)
    except ValueError:
        raise StoreError(f"{args.path}: neither an existing file or folder nor a checkpoint id") from None
    from app.jobs import checkpoint_row         # here: app.jobs loads pandas; only for an id

    return checkpoint_row(Store(args.db), cid)["path"]


def run(args: argparse.Namespace) -> int:
    from loaders.errors import QkvscopeError
    from app.sandbox_jobs import call  # here: only when a checkpoint is read

    if args.tokens is not None and args.tokens < 2:
        raise QkvscopeError(f"--tokens {args.tokens}: expected at least 2")
    if args.heal_steps < 0:
        raise QkvscopeError(f"--heal-steps {args.heal_steps}: expected 0 or more")
    if args.heal is not None and args.heal_steps == 0:
        raise QkvscopeError(f"--heal {args.heal}: expected with --heal-steps N (N > 0)")
    path = _path(args)
    out = call("whatif", path, pooled=True, timeout="QKVSCOPE_ANALYSIS_TIMEOUT_S",
               to=args.to, method=args.method, layers=args.layers, text=args.text, images=args.images,
               grouping=args.grouping,
               tokens=args.tokens,
               heal_steps=args.heal_steps, heal_how=args.heal or "distill", out=args.out, device=args.device)
    if args.json:
        print_json(out)
        return 0
    b = out["baseline"]
    print(f"{shown(out['checkpoint'])}: {out['target']} by {out['method']}, {out['sample']['n_tokens']} tokens "
          f"in {out['sample']['windows']} windows")
    print(f"  {'layers':<18} {'loss':>8} {'ppl':>10} {'95% interval':>20} {'delta':>9} {'KV B/token':>11} {'attn params':>12}")
    _row("original", b, None)
    for s in out["steps"]:
        _row(",".join(map(str, s["layers"])) or "none", s, s["delta_ppl_pct"])
    h = out["healed"]
    if h is not None:
        print(f"  healed {h['steps']} steps: loss {h['loss']:.4f}, ppl {h['ppl']:.3f} ({h['delta_ppl_pct']:+.2f}%)")
    for key, note in out["notes"].items():
        if key == "accuracy":   # images: one line per evaluated model
            for label, a in note.items():
                ci = "" if a["ci_low"] is None else f" ({a['ci_low']:.1%}-{a['ci_high']:.1%})"
                print(f"  accuracy {label or 'none'}: {a['accuracy']:.1%}{ci}")
        else:
            print(f"  {key}: {note}")
    return 0


def _row(label: str, r: dict, delta: float | None) -> None:
    ci = "" if r["ci_low"] is None else f"{r['ci_low']:.3f}-{r['ci_high']:.3f}"
    d = "" if delta is None else f"{delta:+.2f}%"
    print(f"  {label:<18} {r['loss']:>8.4f} {r['ppl']:>10.3f} {ci:>20} {d:>9} "
          f"{r['kv_bytes_per_token']:>11,.0f} {r['attention_params']:>12,}")
