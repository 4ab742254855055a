"""The devices the float64-reference tests run on: the CPU everywhere, CUDA where there is one
(``gpu`` marker: skipped without CUDA, run by ``scripts/gpu_check.sh`` on a GPU machine). The
analysis promises the same 1e-3 against float64 on either device (DESIGN.md, precision)."""
from __future__ import annotations

import pytest

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
