"""Shared checks of the layout tests on checkpoints written by ``transformers``:
a tiny random model, the inputs and outputs of its own projection modules
(forward hooks), and the canonical tensors compared against them."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from app.cli import main


def randomise(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter (biases and norm gains too) made non-trivial, in eval mode."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model.eval()


def capture(model: torch.nn.Module, names: list[str], **inputs) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{module name: (its first input, its output)}`` over one forward pass."""
    mods = dict(model.named_modules())
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    handles = []
    for name in names:
        def hook(module, inp, out, name=name):
            seen.setdefault(name, (inp[0].detach().clone(), out.detach().clone()))
        handles.append(mods[name].register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for h in handles:
            h.remove()
    return seen


def heads(y: torch.Tensor, n: int, d_head: int) -> torch.Tensor:
    """``[..., n*d_head]`` -> ``[n, ..., d_head]``."""
    return y.reshape(*y.shape[:-1], n, d_head).movedim(-2, 0)


def project(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """``x @ W[h] + b[h]`` for every head, float64: ``[n, ..., d_head]``."""
    x = x.double()
    out = torch.einsum("...d,hde->h...e", x, w.double())
    if b is not None:
        out = out + b.double().reshape(b.shape[0], *([1] * (x.dim() - 1)), b.shape[1])
    return out


def check_projections(layer, meta, cap: dict, q: str, k: str, v: str, o: str, atol: float = 1e-4) -> None:
    """q/k/v: ``x @ W[h] + b[h]`` equals the module's output for head h; o: the sum
    over heads of ``z_h @ W_O[h]`` plus ``b_O`` equals the output projection's."""
    for name, w, b, n in ((q, layer.W_Q, layer.b_Q, meta.n_heads), (k, layer.W_K, layer.b_K, meta.n_kv_heads),
                          (v, layer.W_V, layer.b_V, meta.n_kv_heads)):
        x, y = cap[name]
        torch.testing.assert_close(project(x, w, b).float(), heads(y, n, meta.d_head).float(),
                                   atol=atol, rtol=1e-4, msg=name)
    z, y = cap[o]
    out = torch.einsum("h...e,hed->...d", heads(z, meta.n_heads, meta.d_head).double(), layer.W_O.double())
    if layer.b_O is not None:
        out = out + layer.b_O.double()
    torch.testing.assert_close(out.float(), y.float(), atol=atol, rtol=1e-4, msg=o)


def cli(*args: str) -> tuple[int, str, str]:
    """``python -m app ARGS`` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(args))
    return rc, out.getvalue(), err.getvalue()


def cli_json(*args: str) -> dict:
    rc, out, err = cli(*args, "--json")
    assert rc == 0, err
    return json.loads(out)


def reshaped(folder: Path, key: str, shape: tuple[int, ...]) -> Path:
    """The folder's ``model.safetensors`` rewritten with ``key`` of ``shape`` (zeros)."""
    f = folder / "model.safetensors"
    tensors = load_file(f)
    assert key in tensors, sorted(tensors)[:20]
    tensors[key] = torch.zeros(shape)
    save_file(tensors, f, metadata={"format": "pt"})
    return folder


def bad_shape_error(folder: Path) -> str:
    """``info`` on a malformed checkpoint: exit 2, nothing on stdout, one line on stderr."""
    rc, out, err = cli("info", str(folder), "--json")
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]
