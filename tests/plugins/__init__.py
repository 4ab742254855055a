"""Metric plugins the tests load as a user would (``QKVSCOPE_PLUGINS``, README "Adding a metric")."""
