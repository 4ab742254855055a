"""Where the project's own files are (no streamlit import: the CLI uses this too)."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEMO_DIR = ROOT / "data" / "demo"
