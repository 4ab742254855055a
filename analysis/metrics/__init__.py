"""The built-in metrics, one module per family: each declares its metrics (``analysis.registry.Metric``:
name, level, axis, help, direction, the projections it reads, the ties that fix it, its chance rule) and
registers them with ``analysis.registry.register``, the call a plugin makes, with the function computing
each from the layer's shared products (``analysis.products.LayerProducts``) and, for the chance rule
``closed``, its closed form beside the formula.

Importing this package (``analysis.registry`` does, before any plugin) imports every module in it:
the families of ``ORDER`` first, in that order (the order of ``analyze --list``, the JSON rows and the
docs), then any other module alphabetically. Adding a built-in metric is a module here (or a function
in its family's module) and a test; nothing else names it.
"""
import importlib
import pkgutil

#: The families whose metrics come first, in this order.
ORDER = ("kv_similarity", "qk_geometry", "qk_parts", "paper_scale", "spectra", "norms", "query_absorb", "activations")

for _name in (*ORDER, *sorted({m.name for m in pkgutil.iter_modules(__path__)} - set(ORDER))):
    importlib.import_module(f"{__name__}.{_name}")
