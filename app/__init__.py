"""qkvscope's application layer: the CLI (``python -m app``) and the dashboard."""
