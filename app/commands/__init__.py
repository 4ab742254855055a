"""CLI commands, one module each.

A command module defines ``NAME`` (the sub-command), ``HELP`` (one line),
``add_arguments(parser)`` and ``run(args) -> int``. ``app.cli`` discovers the
modules in this package, so adding a command is adding a file.
"""
