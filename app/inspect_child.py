"""What the Inspector reads from a checkpoint file, run in the reading child process.

The Inspector's spectra and attention maps open the stored file
again (the weights are not in the database). An untrusted file is never
opened in the Streamlit server: each function here runs in a child of
the sandbox (``app.sandbox_jobs.call("spectra" | "attention", path, pooled=True,
...)``) under the memory limit (``QKVSCOPE_PARSE_MEMORY_MB`` plus the
file's size, on top of what the child holds after its imports) and a time
limit (``QKVSCOPE_PARSE_TIMEOUT_S`` for one layer's spectra,
``QKVSCOPE_ANALYSIS_TIMEOUT_S`` for a forward pass). A bomb ends that child with one line ``PATH: what`` and the server
goes on. Results come back as JSON, except attention maps (below).

Attention maps are ``[n_layers, n_heads, T, T]`` float32: 64 MB per 16 heads
at 2,048 tokens, so GBs for a whole model, far too many for JSON floats. The
parent makes a private temporary folder (``tempfile.mkdtemp``: mode 0700) and
passes it as ``out``; ``attention`` writes the maps there as one ``.npy``
file, layer by layer (no second copy of the stack in the child), and returns
only tokens, shape and file name. The parent reads it with ``np.load(...,
allow_pickle=False)`` (a plain array: nothing in it can be unpickled),
checks dtype and shape against the answer, and deletes the folder. That
costs one write and one read of the maps (about 1 s per GB on a local disk),
keeps every value exact, and never holds the maps in a pipe.

The tie check of an analysis stored without ties is the sandbox's job ``ties``
(``app.jobs.read_ties``, the reader ``info`` and ``analyze`` share). The spectra's singular values are
``torch.linalg.svdvals`` in float64 (``singular_values`` below): the matrices
are ``[d_model, d_head]``, so an exact float64 SVD costs ``O(d_model d_head^2)``,
as little as the Gram route of ``analysis._linalg`` (private) and without its
eigenvalue cut-off.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

#: The file ``attention`` writes in its ``out`` folder.
MAPS_FILE = "maps.npy"


def singular_values(a):
    """Singular values of the tensor ``a: [rows, cols]``, descending, float64
    (``torch.linalg.svdvals`` of the float64 matrix; ``min(rows, cols)`` values)."""
    import torch  # here: the server imports this module without torch; torch loads in the child

    return torch.linalg.svdvals(a.to(torch.float64))


def spectra(path: str, *, layer: int, head: int) -> list[list]:
    """Rows ``[projection, index, sigma]`` for ``W_Q[h], W_K[g], W_V[g], W_O[h]`` of one
    layer of the checkpoint at ``path`` (``g = h // (n_heads / n_kv_heads)``, the query
    head's kv head; ``W_Q`` left out when the checkpoint has none). Reads that layer only."""
    import torch  # here: the server imports this module without torch; torch loads in the child

    from loaders.checkpoints import open_checkpoint

    rows: list[list] = []
    with open_checkpoint(path) as ckpt, torch.inference_mode():
        meta = ckpt.meta
        w = ckpt.layer(int(layer))
        g = int(head) // (meta.n_heads // meta.n_kv_heads)
        mats = {"W_Q": None if w.W_Q is None else w.W_Q[head], "W_K": w.W_K[g], "W_V": w.W_V[g],
                "W_O": w.W_O[head].mT}  # W_O[h] is [d_head, d_model]; its transpose is tall
        for name, a in mats.items():
            if a is not None:
                rows += [[name, i, float(s)] for i, s in enumerate(singular_values(a).tolist())]
    return rows


def head_groupings(path: str, *, layer: int) -> list[dict]:
    """``analysis.head_grouping.table`` of one layer's W_K: for ``G = n_kv/2, n_kv/4, 1`` the contiguous
    and the best free grouping of its kv heads with their mean-pool residuals. Reads that layer only."""
    from analysis import head_grouping  # here: runs in the reading child (torch)
    from loaders.checkpoints import open_checkpoint

    with open_checkpoint(path) as ckpt:
        f = head_grouping.frobenius_gram(ckpt.layer(int(layer)).W_K)
    return head_grouping.table(head_grouping.groupings(f))


def attention(path: str, *, text: str, max_tokens: int, out: str) -> dict:
    """Run the checkpoint at ``path`` on ``text`` (at most ``max_tokens`` tokens) and write its
    attention maps ``[n_layers, n_heads, T, T]`` (float32, little-endian) to ``out/maps.npy``.

    Returns ``{"tokens", "shape", "file", "reason"}``: ``file`` None and ``reason`` set when
    there are no maps (no forward pass is possible, or the model returned none).
    """
    import torch  # here: the server imports this module without torch; torch loads in the child

    from experiments.attention_maps import capture_activations
    from experiments.runnable import NoForwardPass
    from loaders.checkpoints import open_checkpoint

    with open_checkpoint(path) as ckpt:
        try:
            cap = capture_activations(ckpt, text=text, max_tokens=int(max_tokens))
        except NoForwardPass as exc:
            return {"tokens": [], "shape": None, "file": None, "reason": str(exc)}
    if not cap.layers or any(lc.attn is None for lc in cap.layers):
        return {"tokens": cap.tokens, "shape": None, "file": None,
                "reason": cap.logits_reason or "the model returned no attention maps"}
    first = cap.layers[0].attn
    shape = [len(cap.layers), *first.shape]                     # [n_layers, n_heads, T, T]
    dest = Path(out) / MAPS_FILE
    with open(dest, "xb") as fh:                                # "x": never through a planted file
        np.lib.format.write_array_header_1_0(fh, {"descr": "<f4", "fortran_order": False,
                                                  "shape": tuple(shape)})
        for lc in cap.layers:                                   # one layer's [n_heads, T, T] at a time
            fh.write(np.ascontiguousarray(lc.attn.detach().to("cpu", torch.float32).numpy(), dtype="<f4").data)
    return {"tokens": cap.tokens, "shape": shape, "file": MAPS_FILE, "reason": None}


def read_maps(folder: Path, answer: dict) -> np.ndarray:
    """The parent's side of ``attention``: the maps it wrote in ``folder``, checked to be the
    float32 ``[n_layers, n_heads, T, T]`` array its ``answer`` describes (``allow_pickle=False``)."""
    maps = np.load(Path(folder) / MAPS_FILE, allow_pickle=False)
    want = tuple(int(n) for n in answer["shape"])
    if maps.dtype != np.float32 or maps.shape != want or want[-1] != len(answer["tokens"]):
        raise ValueError(f"attention maps of shape {maps.shape} ({maps.dtype}) where the reading process "
                         f"described {list(want)} for {len(answer['tokens'])} tokens")
    return maps
