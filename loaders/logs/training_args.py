"""A Hugging Face ``training_args.bin``, read without unpickling it.

The Trainer saves its ``TrainingArguments`` beside every checkpoint with
``torch.save(args, "training_args.bin")``: a torch zip whose ``data.pkl``
pickles the dataclass (its fields as a dict of name -> value). Loading it
would run pickle, which qkvscope never does with a file it did not write
(``torch.load(weights_only=True)`` refuses the class). So the pickle's
opcodes are listed with ``pickletools.genops`` (a parser, nothing is
built or called) and each field of ``FIELDS`` is the first value that follows
its name: a number, a string, a bool or None, past the memo opcodes; a field
whose value is an object (an enum such as ``lr_scheduler_type``) takes the
first string inside it (``"linear"``).
"""
from __future__ import annotations

import pickletools
import zipfile
from pathlib import Path

#: The fields read (the run's hyperparameters and its names).
FIELDS = ("learning_rate", "weight_decay", "seed", "warmup_ratio", "warmup_steps", "num_train_epochs",
          "max_steps", "per_device_train_batch_size", "gradient_accumulation_steps", "adam_beta1",
          "adam_beta2", "max_grad_norm", "lr_scheduler_type", "output_dir", "run_name")
#: A larger pickle is no TrainingArguments.
MAX_PICKLE_BYTES = 1 << 20
_STRINGS = {"BINUNICODE", "SHORT_BINUNICODE", "UNICODE", "BINUNICODE8"}
_NUMBERS = {"BINFLOAT", "BININT", "BININT1", "BININT2", "LONG1", "INT", "FLOAT"}
_MEMO = {"BINPUT", "LONG_BINPUT", "MEMOIZE", "PUT"}
_CONSTANTS = {"NEWTRUE": True, "NEWFALSE": False, "NONE": None}


def read_training_args(path: Path) -> dict | None:
    """``FIELDS`` of a ``training_args.bin`` (see the module docstring), or None
    when the file is no torch zip holding a small pickle that names them."""
    try:
        with zipfile.ZipFile(path) as zf:
            name = next((n for n in zf.namelist() if n.endswith("data.pkl")), None)
            if name is None or zf.getinfo(name).file_size > MAX_PICKLE_BYTES:
                return None
            data = zf.read(name)
        ops = [(op.name, arg) for op, arg, _ in pickletools.genops(data)]
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return None
    out: dict = {}
    for i, (op, arg) in enumerate(ops):
        if op not in _STRINGS or arg not in FIELDS or arg in out:
            continue
        j = i + 1
        while j < len(ops) and ops[j][0] in _MEMO:
            j += 1
        if j >= len(ops):
            break
        nxt, val = ops[j]
        rest = [(o, v) for o, v in ops[j:j + 8] if o not in _MEMO]
        if len(rest) >= 3 and rest[0][0] in _STRINGS and rest[1][0] in _STRINGS and rest[2][0] == "STACK_GLOBAL":
            # an enum pickled with protocol 4: module, class, STACK_GLOBAL, then its value
            out[arg] = next((v for o, v in rest[3:] if o in _STRINGS), None)
            continue
        if nxt in _NUMBERS or nxt in _STRINGS:
            out[arg] = val
        elif nxt in _CONSTANTS:
            out[arg] = _CONSTANTS[nxt]
        elif nxt in ("GLOBAL", "STACK_GLOBAL"):          # an enum: its value is the next string
            out[arg] = next((v for o, v in ops[j + 1:j + 6] if o in _STRINGS), None)
    return out or None
