"""GPU names as people write them: aliases, any case, with the names in the error."""
from __future__ import annotations

import pytest

from analysis.errors import AnalysisError
from analysis.gpus import ALIASES, CATALOGUE, get_gpu, resolve_gpu_name


@pytest.mark.parametrize("spelling, name", [
    ("H100", "h100-sxm"), ("h100", "h100-sxm"), ("H100 SXM5", "h100-sxm"), ("NVIDIA H100 SXM 80GB", "h100-sxm"),
    ("h100 pcie", "h100-pcie"), ("H100-PCIe", "h100-pcie"), ("nvidia h100 pcie", "h100-pcie"),
    ("A100", "a100-80gb"), ("a100 80gb", "a100-80gb"), ("A100_40GB", "a100-40gb"), ("a100 40g", "a100-40gb"),
    ("RTX 4090", "rtx-4090"), ("NVIDIA GeForce RTX 4090", "rtx-4090"), ("4090", "rtx-4090"),
    ("H200", "h200"), ("MI300X", "mi300x"), ("AMD Instinct MI300X", "mi300x"), ("L40S", "l40s"),
    ("  h100-sxm ", "h100-sxm"),
])
def test_common_spellings_resolve(spelling, name):
    assert resolve_gpu_name(spelling) == name
    assert get_gpu(spelling) is CATALOGUE[name]


def test_every_catalogue_name_and_label_resolves_to_itself():
    for name, gpu in CATALOGUE.items():
        assert resolve_gpu_name(name) == name
        assert resolve_gpu_name(gpu.label) == name
        assert resolve_gpu_name(name.upper()) == name


def test_aliases_point_into_the_catalogue():
    assert set(ALIASES.values()) <= set(CATALOGUE)


@pytest.mark.parametrize("bad", ["tpu", "", "h1000", "a10"])
def test_unknown_gpu_lists_the_names_and_their_aliases(bad):
    with pytest.raises(AnalysisError) as exc:
        get_gpu(bad)
    assert str(exc.value) == (
        f"unknown GPU {bad!r}: expected one of h100-sxm (h100, h100 sxm5, h100 80gb), h100-pcie (h100 pcie), "
        "h200 (h200 sxm), b200 (b200 hgx), a100-40gb (a100 40g), a100-80gb (a100, a100 sxm, a100 80g), l40s, "
        "l4, a10g, rtx-4090 (rtx 4090, 4090), mi300x, edge-phone (phone); any case, spaces or hyphens, "
        "or the label --list-gpus prints")
