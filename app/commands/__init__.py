"""CLI commands, one module each.

A command module defines ``NAME`` (the sub-command), ``HELP`` (one line),
``add_arguments(parser)`` and ``run(args) -> int``. ``app.cli`` discovers the
modules in this package, so adding a command is adding a file.

Every command module is imported to build the parser, so none imports torch at
module level: ``python -m app --help``, ``runs``, ``checkpoints``, ``kv-cost``
and the parent of ``ingest``/``info`` (which parse in a child process) start
without it. Options and defaults come from torch-free modules
(``experiments.config``, ``analysis.registry``); a command imports torch-using
modules inside ``run`` (each such import says so).
"""
