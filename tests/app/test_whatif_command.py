"""``python -m app whatif``'s parser and its checks before a checkpoint is opened, in process."""
import pytest

from app.cli import build_parser
from app.commands import whatif
from loaders.errors import QkvscopeError


def _parser():
    [action] = [a for a in build_parser(whatif)._actions if a.dest == "command"]
    return action.choices["whatif"]


def test_help_documents_every_flag_of_the_contract():
    text = _parser().format_help()
    usage = " ".join(text[:text.index("\n\n")].split())
    for flag in ("--to TARGET", "[--method M]", "[--layers all|greedy|L,L,...]", "[--text FILE | --images DATASET]",
                 "[--tokens N]", "[--heal-steps N]", "[--heal {distill,lm}]", "[--out DIR]",
                 "[--device {cpu,cuda}]", "[--json]", "PATH_OR_ID"):
        assert flag in usage, flag
    # the first column of the targets' table: "  k_eq_v   ...", "  gqa:G, mqa   ..."
    column = {t for line in text.splitlines() if line.startswith("  ") and line[2] != " "
              for t in line[2:14].replace(",", " ").split()}
    assert {"k_eq_v", "q_eq_k", "q_eq_k_eq_v", "wq_identity", "gqa:G", "mqa", "latent:R"} <= column
    for method in ("lstsq", "keep_k", "keep_v", "avg", "psd", "keep_q", "mean", "aligned", "svd", "basis"):
        assert method in text, method
    for source in ("arXiv 2305.13245", "arXiv 2412.20677", "arXiv 2502.14837", "arXiv 2510.23912"):
        assert source in text, source
    assert "checkpoint, target, method, sample, baseline, steps, healed, notes" in " ".join(text.split())


def test_defaults_and_the_checks_before_a_checkpoint_is_opened():
    args = _parser().parse_args(["ckpt.pt", "--to", "k_eq_v"])
    assert (args.layers, args.heal_steps, args.heal, args.tokens, args.json) == ("all", 0, None, None, False)
    for argv, message in ((["--tokens", "1"], "--tokens 1: expected at least 2"),
                          (["--heal-steps", "-1"], "--heal-steps -1: expected 0 or more"),
                          (["--heal", "lm"], "--heal lm: expected with --heal-steps N (N > 0)")):
        with pytest.raises(QkvscopeError) as exc:
            whatif.run(_parser().parse_args(["ckpt.pt", "--to", "k_eq_v", *argv]))
        assert str(exc.value) == message
