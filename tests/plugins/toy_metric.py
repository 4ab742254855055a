"""A toy metric registered exactly as docs/contributing.md's "Adding a metric" shows: mean |W_V[g]| per kv head.

Loaded by ``QKVSCOPE_PLUGINS=tests.plugins.toy_metric`` (``tests/app/test_plugin_metric.py``).
For the random layers of ``analysis.chance`` (entries ``N(0, 1/d_model)``) its
chance level is ``E|x| = sqrt(2 / (pi d_model))``.
"""
from analysis.registry import Metric, register


@register(Metric("toy_mean_abs_v", "weights", "kv_head", "toy", "mean |W_V[g]| over its d_model x d_head entries",
                 direction="none", chance="monte_carlo",
                 chance_help="median of random Gaussian layers of the same shapes: sqrt(2 / (pi d_model))",
                 reads=("V",)))
def mean_abs_v(layer, meta, device):
    return layer.W_V.abs().mean(dim=(1, 2))          # [n_kv_heads, d_model, d_head] -> [n_kv_heads]
