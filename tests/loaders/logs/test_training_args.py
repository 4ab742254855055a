"""``training_args.bin`` read from its pickle's opcodes: the fields a person
sees in ``TrainingArguments``, and nothing in the file ever runs."""
from __future__ import annotations

import pickle
import zipfile

import pytest
import torch

from loaders.logs.training_args import read_training_args


@pytest.mark.parametrize("protocol", [2, 4])
def test_fields_of_the_trainers_own_file(tmp_path, protocol):
    from transformers import TrainingArguments
    p = tmp_path / "training_args.bin"
    torch.save(TrainingArguments(output_dir=str(tmp_path / "out"), learning_rate=3e-4, weight_decay=0.1, seed=7,
                                 warmup_steps=10, lr_scheduler_type="cosine", report_to=[]), p,
               pickle_protocol=protocol)
    got = read_training_args(p)
    assert {k: got[k] for k in ("learning_rate", "weight_decay", "seed", "warmup_steps", "lr_scheduler_type",
                                "output_dir")} == {
        "learning_rate": 3e-4, "weight_decay": 0.1, "seed": 7, "warmup_steps": 10, "lr_scheduler_type": "cosine",
        "output_dir": str(tmp_path / "out")}


class _Boom:
    """Unpickling this would create ``marker``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_hostile_pickle_is_listed_never_run(tmp_path):
    marker = tmp_path / "ran"
    p = tmp_path / "training_args.bin"
    with zipfile.ZipFile(p, "w") as zf:
        zf.writestr("training_args/data.pkl", pickle.dumps({"learning_rate": 1e-3, "x": _Boom(marker)}, protocol=2))
    assert read_training_args(p) == {"learning_rate": 1e-3}
    assert not marker.exists()
    p.write_bytes(b"not a zip")
    assert read_training_args(p) is None
