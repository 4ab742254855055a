"""GPU catalogue for the serving-cost calculator, with the source of every figure.

Units: memory in bytes, bandwidth in bytes/s, throughput in FLOP/s. A datasheet's
"80GB" is taken as 80e9 bytes (GB = 1e9), which is conservative: the capacity a
driver reports is usually a little larger (an H100 80GB shows 81,559 MiB =
85.5e9 bytes in ``nvidia-smi``). ``bf16_flops`` is the DENSE bf16 tensor
throughput; NVIDIA datasheets print the 2:4-sparse figure first, twice the dense
one, and say so in a footnote, so the sparse figure is halved here.

Prices are not specifications: ``price_per_hour`` is an assumed on-demand rate
(USD) for one GPU, to be replaced with the user's own (every caller takes an
override). ``sources`` names where each of memory, bandwidth and bf16 figure
comes from.

Names: :func:`get_gpu` accepts a catalogue name, its label, or a common
spelling in ``ALIASES``, in any case and with any spaces, hyphens or
underscores, and with or without the vendor words (``H100``, ``nvidia h100
pcie``, ``RTX 4090``, ``A100``). A bare ``H100`` is the SXM part and a bare
``A100`` the 80GB one, the parts cloud providers rent by those names.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from analysis.errors import AnalysisError

GB = 1e9
GIB = 2 ** 30
TB_S = 1e12
TFLOPS = 1e12

_PRICE_NOTE = "assumed on-demand rate, not a quote: set your own"


@dataclass(frozen=True)
class GPU:
    """One accelerator. ``sources`` maps ``memory``, ``bandwidth``, ``bf16`` and
    ``price`` to where the figure comes from."""

    name: str
    label: str
    memory_bytes: float
    bandwidth_bytes_s: float
    bf16_flops: float
    price_per_hour: float
    sources: dict = field(default_factory=dict)

    def with_overrides(self, *, memory_bytes: float | None = None,
                       bandwidth_bytes_s: float | None = None,
                       bf16_flops: float | None = None,
                       price_per_hour: float | None = None) -> "GPU":
        """A copy with the given figures replaced (None keeps the catalogue's)."""
        changes = {k: v for k, v in dict(memory_bytes=memory_bytes, bandwidth_bytes_s=bandwidth_bytes_s,
                                         bf16_flops=bf16_flops, price_per_hour=price_per_hour).items()
                   if v is not None}
        for key, value in changes.items():
            if not value >= 0:
                raise AnalysisError(f"GPU {self.name}: {key} must be a number >= 0, got {value!r}")
        return replace(self, **changes) if changes else self

    def to_json(self) -> dict:
        return {
            "name": self.name, "label": self.label,
            "memory_bytes": self.memory_bytes, "memory_GB": self.memory_bytes / GB,
            "bandwidth_bytes_s": self.bandwidth_bytes_s, "bandwidth_TB_s": self.bandwidth_bytes_s / TB_S,
            "bf16_flops": self.bf16_flops, "bf16_TFLOPS": self.bf16_flops / TFLOPS,
            "price_per_hour": self.price_per_hour, "sources": dict(self.sources),
        }


_H100 = "NVIDIA H100 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h100/"
_H200 = "NVIDIA H200 product page, https://www.nvidia.com/en-us/data-center/h200/"
_HGX = ("NVIDIA HGX platform page, 'HGX B200' individual GPU specifications, "
        "https://www.nvidia.com/en-us/data-center/hgx/")
_A100 = ("NVIDIA A100 datasheet (SXM column), "
         "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
         "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf")
_L40S = "NVIDIA L40S product page / datasheet, https://www.nvidia.com/en-us/data-center/l40s/"
_L4 = "NVIDIA L4 product page / datasheet, https://www.nvidia.com/en-us/data-center/l4/"
_A10G = ("Baseten, 'NVIDIA A10 vs A10G for ML model inference' (NVIDIA publishes no A10G "
         "datasheet; AWS G5), https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/")
_ADA = ("NVIDIA Ada Lovelace GPU architecture whitepaper v2.1, Appendix A table 'GeForce RTX 4090' "
        "(peak BF16 tensor TFLOPS with FP32 accumulate, dense), "
        "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf")
_MI300X = ("AMD Instinct MI300X data sheet, "
           "https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/data-sheets/"
           "amd-instinct-mi300x-data-sheet.pdf")


def _datasheet(name: str, label: str, memory_gb: float, bandwidth_tb_s: float, bf16_tflops: float, price: float,
               source: str, memory: str, bandwidth: str, bf16: str, price_note: str = _PRICE_NOTE) -> GPU:
    """A GPU whose memory, bandwidth and bf16 figures all come from one ``source``; ``memory``,
    ``bandwidth`` and ``bf16`` say what the source prints for each."""
    return GPU(name, label, memory_gb * GB, bandwidth_tb_s * TB_S, bf16_tflops * TFLOPS, price, {
        "memory": f"{memory}: {source}", "bandwidth": f"{bandwidth}: {source}", "bf16": f"{bf16}: {source}",
        "price": price_note})


#: One row a datasheet GPU: name, label, memory GB, bandwidth TB/s, dense bf16 TFLOPS, USD per
#: hour, source, then what the source prints for memory, bandwidth and bf16 (and a price note).
_DATASHEETS = (
    ("h100-sxm", "NVIDIA H100 SXM 80GB", 80, 3.35, 989.4, 3.00, _H100, "80GB HBM3", "3.35 TB/s", "1,979 TFLOPS with sparsity, dense = half = 989.4"),
    ("h100-pcie", "NVIDIA H100 PCIe 80GB", 80, 2.0, 756.5, 2.50, _H100, "80GB HBM2e", "2 TB/s", "1,513 TFLOPS with sparsity, dense = half = 756.5"),
    ("h200", "NVIDIA H200 SXM 141GB", 141, 4.8, 989.4, 3.70, _H200, "141GB HBM3e", "4.8 TB/s", "1,979 TFLOPS with sparsity, dense = half = 989.4"),
    ("b200", "NVIDIA B200 (HGX) 180GB", 180, 7.7, 2250, 6.00, _HGX, "180GB HBM3e per GPU (HGX B200 total 'up to 1.4TB' for 8)", "7.7 TB/s per GPU", "FP16/BF16 tensor 4.5 PFLOPS with sparsity, dense = half = 2,250 TFLOPS"),
    ("a100-40gb", "NVIDIA A100 SXM 40GB", 40, 1.555, 312, 1.30, _A100, "40GB HBM2", "1,555 GB/s", "312 TFLOPS dense (624 with sparsity)"),
    ("a100-80gb", "NVIDIA A100 SXM 80GB", 80, 2.039, 312, 1.80, _A100, "80GB HBM2e", "2,039 GB/s", "312 TFLOPS dense (624 with sparsity)"),
    ("l40s", "NVIDIA L40S 48GB", 48, 0.864, 362.05, 1.00, _L40S, "48GB GDDR6 with ECC", "864 GB/s", "733 TFLOPS with sparsity, dense = half = 362.05 (366 dense in some revisions)"),
    ("l4", "NVIDIA L4 24GB", 24, 0.300, 121, 0.70, _L4, "24GB GDDR6", "300 GB/s", "242 TFLOPS with sparsity, dense = half = 121"),
    ("a10g", "NVIDIA A10G 24GB (AWS G5)", 24, 0.600, 70, 1.006, _A10G, "24GB GDDR6", "600 GB/s", "70 TFLOPS tensor (vs 125 for the A10)", "AWS g5.xlarge on-demand, us-east-1 (includes host); " + _PRICE_NOTE),
    ("rtx-4090", "NVIDIA GeForce RTX 4090 24GB", 24, 1.008, 165.2, 0.40, _ADA, "24GB GDDR6X", "1,008 GB/s", "165.2 TFLOPS dense (330.4 with sparsity)"),
    ("mi300x", "AMD Instinct MI300X 192GB", 192, 5.3, 1307.4, 2.50, _MI300X, "192GB HBM3", "5.3 TB/s peak", "1,307.4 TFLOPS dense (2,614.9 with sparsity)"),
)

CATALOGUE: dict[str, GPU] = {g.name: g for g in (
    *(_datasheet(*row) for row in _DATASHEETS),
    GPU("edge-phone", "Edge profile: phone-class SoC, 12GB LPDDR5X", 12 * GB, 68.3 * GB, 4 * TFLOPS, 0.0, {
        "memory": "profile, not a product: 12GB, the RAM of a 2024 flagship phone (shared with "
                  "the OS: lower the usable fraction)",
        "bandwidth": "profile: LPDDR5X-8533 on a 64-bit bus, 8533e6 transfers/s * 8 bytes = "
                     "68.3 GB/s (JEDEC JESD209-5B speed grade)",
        "bf16": "profile: 4 TFLOPS fp16/bf16, the order of a phone GPU/NPU; edit for your device",
        "price": "0: on-device, no hourly price"}),
)}


#: Common spellings and the catalogue entry each means (matched after :func:`_compact`).
ALIASES: dict[str, str] = {
    "h100": "h100-sxm", "h100 sxm5": "h100-sxm", "h100 80gb": "h100-sxm",
    "h100 pcie": "h100-pcie",
    "h200 sxm": "h200",
    "b200 hgx": "b200",
    "a100": "a100-80gb", "a100 sxm": "a100-80gb", "a100 80g": "a100-80gb",
    "a100 40g": "a100-40gb",
    "rtx 4090": "rtx-4090", "4090": "rtx-4090",
    "phone": "edge-phone",
}
_VENDOR_WORDS = ("nvidia", "geforce", "amd", "instinct", "tesla")


def _compact(name: str) -> str:
    """Lower case, vendor words and every non-alphanumeric character removed:
    ``"NVIDIA GeForce RTX 4090"`` -> ``"rtx4090"``."""
    key = str(name).lower()
    for word in _VENDOR_WORDS:
        key = key.replace(word, "")
    return re.sub(r"[^a-z0-9]", "", key)


def _lookup() -> dict[str, str]:
    table = {}
    for gpu in CATALOGUE.values():
        table[_compact(gpu.name)] = gpu.name
        table[_compact(gpu.label)] = gpu.name
    for alias, target in ALIASES.items():
        table[_compact(alias)] = target
    return table


_LOOKUP = _lookup()


def resolve_gpu_name(name: str) -> str:
    """The catalogue name that ``name`` spells (``"H100"`` -> ``"h100-sxm"``); AnalysisError
    lists the catalogue names and every accepted alias."""
    found = _LOOKUP.get(_compact(name)) if str(name).strip() else None
    if found is None:
        names = []
        for gpu in CATALOGUE:
            also = [a for a, t in ALIASES.items() if t == gpu]
            names.append(f"{gpu} ({', '.join(also)})" if also else gpu)
        raise AnalysisError(f"unknown GPU {name!r}: expected one of {', '.join(names)}; "
                            "any case, spaces or hyphens, or the label --list-gpus prints")
    return found


def get_gpu(name: str) -> GPU:
    """The catalogue entry ``name`` spells (see :func:`resolve_gpu_name`)."""
    return CATALOGUE[resolve_gpu_name(name)]
