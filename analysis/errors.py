"""Errors for inputs that an analysis cannot take (wrong shapes, missing data).

``analysis`` imports nothing from ``loaders`` (imports point one way), so it has
its own base error; the CLI and the app treat it like ``QkvscopeError``.
"""


class AnalysisError(ValueError):
    """An analysis was given input it cannot use; the message says which and why."""
