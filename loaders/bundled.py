"""Where qkvscope's own files are, in a checkout and once installed, and where its database lives.

In a checkout the bundled files are ``data/demo`` (the demo experiments),
``data/corpus`` (the text for forward passes) and ``assets/``; ``pip install``
ships ``data/`` as ``loaders/_data/`` (``setup.py``), so ``data_dir()`` is the
first of the two that exists. A checkout is a source tree that holds
``pyproject.toml`` beside the packages (an editable install is one too).

The default database (``default_db_path``): ``$QKVSCOPE_DB`` if set, else
``data/qkvscope.duckdb`` in a checkout, else ``qkvscope.duckdb`` in the
user data folder (``platformdirs.user_data_path("qkvscope")``, e.g.
``~/.local/share/qkvscope`` on Linux).
"""
from __future__ import annotations

import os
from pathlib import Path

#: The folder that holds the packages: the checkout, or site-packages once installed.
PACKAGE_ROOT = Path(__file__).resolve().parents[1]
INSTALLED_DATA = Path(__file__).resolve().parent / "_data"
DB_ENV = "QKVSCOPE_DB"
DB_NAME = "qkvscope.duckdb"


def in_checkout() -> bool:
    """True when the packages are imported from a source tree (``pyproject.toml`` beside them)."""
    return (PACKAGE_ROOT / "pyproject.toml").is_file()


def data_dir() -> Path:
    """The bundled data folder: ``loaders/_data`` when installed, else the checkout's ``data/``."""
    return INSTALLED_DATA if INSTALLED_DATA.is_dir() else PACKAGE_ROOT / "data"


def demo_dir() -> Path:
    """The bundled demo experiments (``data/demo``)."""
    return data_dir() / "demo"


def corpus_dir() -> Path:
    """The bundled text corpus (``data/corpus``)."""
    return data_dir() / "corpus"


def user_db_path() -> Path:
    """``qkvscope.duckdb`` in the user data folder (created when the database is)."""
    import platformdirs  # here: only an installed qkvscope without $QKVSCOPE_DB needs it

    return platformdirs.user_data_path("qkvscope") / DB_NAME


def default_db_path() -> Path:
    """``$QKVSCOPE_DB``, else ``data/qkvscope.duckdb`` in a checkout, else ``user_db_path()``."""
    env = os.environ.get(DB_ENV)
    if env:
        return Path(env).expanduser()
    return PACKAGE_ROOT / "data" / DB_NAME if in_checkout() else user_db_path()
