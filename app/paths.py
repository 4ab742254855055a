"""Where the project's own files are (no streamlit import: the CLI uses this too).

``loaders.bundled`` finds them in a checkout and in an installed package alike.
"""
from pathlib import Path

from loaders.bundled import PACKAGE_ROOT, demo_dir

#: The folder holding the packages: the checkout, or site-packages when installed.
ROOT = PACKAGE_ROOT
DEMO_DIR = demo_dir()
_ASSETS = Path(__file__).resolve().parent / "_assets"
#: The dashboard's logo (``assets/logo.png``; ``app/_assets/`` when installed).
LOGO = (_ASSETS if _ASSETS.is_dir() else ROOT / "assets") / "logo.png"
