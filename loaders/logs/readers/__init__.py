"""Log readers: one module per log format, each turning one file (or the
appended tail of one) into ``loaders.logs.base.Parsed``.

The reader protocol. A module in this package (name not starting with
``_``) is a reader when it defines:

* ``NAME: str``: the format's name (``ingest_log(..., format=NAME)``, ``runs.format``),
  also the module's file name.
* ``PRIORITY: int``: detection order, lower first. 10-19 binary framings
  and databases (``tensorboard``, ``wandb_offline``, the SQLite stores
  ``mlflow_sqlite`` and ``trackio``), 20-29 torch zips told apart by their pickle index
  (``query_free``, ``projection_sharing``), 30-39 JSON documents
  (``hf_trainer``, before JSON lines: a one-line trainer state is also a JSON
  line with a ``global_step``), 40-49 JSON lines, 50-59 CSV (``wandb_csv``,
  ``csv_long``, ``lightning``, ``csv_wide``: ``_csv.classify_csv`` gives each
  file exactly one of them), 60-69 stdout logs matched by their line patterns
  (``llmc``, ``modded_nanogpt``, ``nanogpt``).
* ``HELP: str``: what it reads, in one line.
* ``APPENDABLE: bool``: a log that grew is read from where the last read
  stopped (``read_bytes``, the end of a complete line); otherwise a changed
  file is read again whole and its points replace what it stored before.
* ``sniff(path, head) -> bool``: whether the file is of this format, from
  ``head``, its first ``base.HEAD_BYTES`` (64 KB), or a longer first line
  whole and 64 KB after it (``base.read_head``); cheap: a text reader looks
  at the first lines only, a torch-zip reader reads the zip's small pickle
  index (never unpickled). Text readers refuse binary heads
  (``base.is_text_head``).
* ``read(path, *, start=0, state=None, complete=False) -> Parsed``: the runs
  in ``path`` from byte ``start`` on, ``state`` being the ``Parsed.state`` of
  the previous read of the same file; ``complete``: the file is not being
  written, so a last line without a newline is read too (``base.complete_lines``).
  A reader that is not ``APPENDABLE`` is always called with ``start=0`` and
  ignores ``state`` and ``complete``. Content it cannot read raises
  ``LogFormatError`` naming the file, what was expected and what was found.

and optionally:

* ``EXAMPLE: str``: a path the format is typically found at (such as
  ``lightning_logs/version_0/metrics.csv``), shown in the generated log-format
  reference (``docs/reference/log-formats.md``).
* ``ROWS_READ_BY_STORE = True``: ``read`` plans only (``base.SqlPoints``) and
  the store step reads the rows inside its transaction (the CSV readers).
* ``JOINS_RUN = True``: its points join the run already stored for their
  source (``loaders.logs.run_identity``), which keeps its format and
  metadata (``hf_results``: a Trainer's final metrics).
* ``INSIDE_CHECKPOINT = True``: its files are checkpoints first, which the
  checkpoint loader owns: ``detect_log`` never picks it, ``ingest`` offers a
  checkpoint file to it (``loaders.ingest``) and ``ingest_log(..., format=NAME)`` reads one.
* ``sniff_dir(folder) -> Path | None``: for a format whose run is a folder
  (a tracker's run, a Lightning version folder): the file that stands for
  the folder when it is one run of this format, else None. That file is
  what ``read`` is given (it reads the folder around it) and what the ingest
  journal keys; ``registry.folder_unit`` asks every reader that has one, for
  a folder given as the path and for a file whose folder it stands for
  (a config-looking name such as MLflow's ``meta.yaml`` included).
* ``FOLDER_UNIT = True`` (with ``sniff_dir``): the whole folder is the run's:
  the folder walk takes that one file from it and nothing else, no sub-folder
  either (``loaders.tracker_stores`` holds these layouts, light enough for
  the walk), and a change to any file in it reads the run again whole. A
  Lightning folder is not one: its ``hparams.yaml`` and ``checkpoints/`` are
  walked as usual.

``discover()`` finds the modules by these attributes (as ``loaders.layouts``
finds its converters); nothing else lists them. A new format is a new module
here (copy ``jsonl.py``).

The launchers' readers sit among them by the same numbers: ``hf_results``
and ``lm_eval`` with the JSON documents (31, 32), ``megatron``,
``hf_stdout``, ``deepspeed``, ``fairseq``, ``torchtune`` with the stdout logs
(63-68): a Megatron-DeepSpeed log is Megatron's, a Trainer's log with
DeepSpeed lines the Trainer's (the lower number wins). What a reader saw but
could not read (lines cut short, values that are no number) goes in
``Parsed.notes``, which the file's report line says; a file with nothing
readable is a ``LogFormatError`` instead.
"""
from __future__ import annotations

import sys
from types import ModuleType

from loaders.discovery import modules


def discover() -> dict[str, ModuleType]:
    """Every reader module of this package, by ``NAME``, in detection order
    (``PRIORITY``, then ``NAME``). Two modules of one ``NAME`` are an error."""
    mods = modules(sys.modules[__name__], ("NAME", "PRIORITY", "sniff", "read"))
    out: dict[str, ModuleType] = {}
    for mod in sorted(mods, key=lambda m: (m.PRIORITY, m.NAME)):
        if mod.NAME in out:
            raise ValueError(f"log readers {out[mod.NAME].__name__} and {mod.__name__} "
                             f"are both named {mod.NAME!r}")
        out[mod.NAME] = mod
    return out


#: Every reader, by name, in detection order.
READERS: dict[str, ModuleType] = discover()
