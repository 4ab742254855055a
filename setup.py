"""The packages of the distribution ``qkvscope`` (its metadata: pyproject.toml).

The code is the four top-level packages ``app``, ``analysis``, ``loaders`` and
``experiments``. The bundled files live outside them in a checkout and ship
inside them when installed: ``data/demo`` and ``data/corpus`` as
``loaders/_data/`` (found by ``loaders.bundled``), ``assets/logo.png`` as
``app/_assets/``.
"""
from setuptools import find_packages, setup

CODE = ["app", "analysis", "loaders", "experiments"]

setup(
    packages=[*find_packages(include=[p for c in CODE for p in (c, f"{c}.*")]), "loaders._data", "app._assets"],
    package_dir={"loaders._data": "data", "app._assets": "assets"},
    package_data={"loaders._data": ["demo/**/*", "corpus/*"], "app._assets": ["logo.png"]},
    exclude_package_data={"loaders._data": ["*.duckdb", "*.duckdb.wal"]},
)
