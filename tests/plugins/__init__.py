"""Metric plugins the tests load as a user would (``QKVSCOPE_PLUGINS``, docs/contributing.md, "Adding a metric")."""
