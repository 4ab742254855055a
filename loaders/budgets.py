"""Budgets for reading untrusted files, each checked before anything is allocated.

A checkpoint or log of a few KB can describe gigabytes: a tensor whose strides
are zero (``torch.zeros(1).expand(73728, 24576)``), a pickle memo that repeats
one list ten times at each of nine levels, a YAML alias bomb, a TFRecord
header claiming 4 GiB. Every reader checks what it is about to build against
one of the budgets below and raises a one-line error naming the budget instead.

=============================  ===========  ==========================================
budget (environment variable)  default      what it bounds
=============================  ===========  ==========================================
``QKVSCOPE_SIDE_ITEMS``        10,000       values in a checkpoint's side data (all
                                            non-weight entries together), or in a YAML
                                            config after its aliases are expanded
``QKVSCOPE_SIDE_DEPTH``        32           nesting depth of side data / YAML
``QKVSCOPE_SIDE_BYTES``        1 MiB        text (strings, keys) in side data
``QKVSCOPE_YAML_BYTES``        1 MiB        size of one YAML config file
``QKVSCOPE_RECORD_BYTES``      64 MiB       one TensorBoard (TFRecord) or W&B (.wandb) record
``QKVSCOPE_ZIP_TOTAL_BYTES``   64 GiB       bytes written when extracting a zip upload
``QKVSCOPE_ALLOW_SPARSE``      0            1: read safetensors tensors that lie in a
                                            hole of a sparse file (refused by default)
``QKVSCOPE_PARSE_MEMORY_MB``   4,096        private writable memory (``RLIMIT_DATA``)
                                            the process reading one file may add to
                                            what it holds after its imports, plus
                                            that file's size
``QKVSCOPE_PARSE_TIMEOUT_S``   600          seconds that process may spend on one file
``QKVSCOPE_ANALYSIS_TIMEOUT_S`` 7,200       seconds the process analysing one checkpoint (its
                                            weight and activation metrics) may take
``QKVSCOPE_CSV_LINE_BYTES``    2 MiB        one line of a CSV log (a longer line refuses
                                            the file: it is never read without that line)
``QKVSCOPE_TOKENIZER_BYTES``   64 MiB       one llama2.c ``tokenizer.bin``
=============================  ===========  ==========================================

Values are read from the environment when a reader starts (``budget(name)``),
so ``QKVSCOPE_SIDE_ITEMS=50000 python -m app ingest ...`` raises one budget for
one run. A tensor's storage is not a budget but a rule (``check_tensor``): its
elements must not overlap and must lie inside the bytes its file holds.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

#: name -> (default, help); ``budget(name)`` reads the environment override.
BUDGETS: dict[str, tuple[int, str]] = {
    "QKVSCOPE_SIDE_ITEMS": (10_000, "values in a checkpoint's side data or an expanded YAML config"),
    "QKVSCOPE_SIDE_DEPTH": (32, "nesting depth of side data and YAML configs"),
    "QKVSCOPE_SIDE_BYTES": (1 << 20, "bytes of text in a checkpoint's side data"),
    "QKVSCOPE_YAML_BYTES": (1 << 20, "size of one YAML config file"),
    "QKVSCOPE_RECORD_BYTES": (64 << 20, "one TensorBoard (TFRecord) or W&B (.wandb) record"),
    "QKVSCOPE_ZIP_TOTAL_BYTES": (64 << 30, "bytes written when extracting one zip upload"),
    "QKVSCOPE_ALLOW_SPARSE": (0, "1 reads safetensors tensors lying in a hole of a sparse file"),
    "QKVSCOPE_PARSE_MEMORY_MB": (4096, "memory the process reading one file may add after its imports, "
                                       "plus the file's size"),
    "QKVSCOPE_PARSE_TIMEOUT_S": (600, "seconds the process reading one file may take"),
    "QKVSCOPE_ANALYSIS_TIMEOUT_S": (7200, "seconds the process analysing one checkpoint may take"),
    "QKVSCOPE_CSV_LINE_BYTES": (2 << 20, "bytes of one line of a CSV log"),
    "QKVSCOPE_TOKENIZER_BYTES": (64 << 20, "size of one llama2.c tokenizer.bin"),
}


class BudgetExceeded(Exception):
    """A budget was hit; ``str()`` is the problem, the caller adds the path."""


def budget(name: str) -> int:
    """The budget's value: ``$name`` if set to a non-negative integer, else its default."""
    default = BUDGETS[name][0]
    raw = os.environ.get(name, "").strip().replace("_", "")
    try:
        value = int(raw)
    except ValueError:
        return default
    return value if value >= 0 else default


def over(name: str, what: str) -> BudgetExceeded:
    """``BudgetExceeded`` whose message names the budget and how to raise it."""
    return BudgetExceeded(f"{what}, over the budget of {budget(name):,} ({name}; set it in the "
                          f"environment to raise it)")


def memory_limit_bytes(file_bytes: int) -> int:
    """The private writable memory (``RLIMIT_DATA``) the process reading a file of
    ``file_bytes`` may add to what it holds when the file's request starts
    (``loaders.sandbox`` adds that): ``QKVSCOPE_PARSE_MEMORY_MB`` MiB plus the file
    itself (a reader may copy the whole file, or map it copy-on-write)."""
    return (budget("QKVSCOPE_PARSE_MEMORY_MB") << 20) + max(0, int(file_bytes))


def memory_exceeded(limit_bytes: int) -> str:
    """The one-line problem for a file whose reading hit the memory limit."""
    return (f"reading it needed more than {limit_bytes / (1 << 30):.1f} GiB of memory (limit "
            f"QKVSCOPE_PARSE_MEMORY_MB={budget('QKVSCOPE_PARSE_MEMORY_MB'):,} plus the file's size; "
            f"set it in the environment to raise it)")


def time_exceeded(name: str = "QKVSCOPE_PARSE_TIMEOUT_S", doing: str = "reading") -> str:
    """The one-line problem for a file whose reading (or analysis) ran past its time limit."""
    return (f"{doing} it took more than {budget(name):,} s (limit {name}; set it in the environment "
            f"to raise it)")


# -- tensors -------------------------------------------------------------------

def tensor_problem(t) -> str | None:
    """Why a freshly unpickled tensor may not be read, or ``None``.

    A tensor is read only if its elements occupy distinct bytes of its own
    storage: sorting the dimensions of size > 1 by stride, each stride must
    exceed the largest offset the smaller ones reach (so no zero stride, no
    overlap), and ``storage_offset + max offset + 1`` elements must fit in
    ``untyped_storage().nbytes()``. Then ``numel * element_size`` is at most
    the storage's size, which the file holds: copying or converting it costs
    no more than the file. Checked on the tensor as loaded, before any copy.
    """
    dims = sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz > 1)
    reach = 0                                   # largest element offset reached so far
    for st, sz in dims:
        if st <= reach:
            return (f"shape {list(t.shape)} with strides {list(t.stride())} reuses its storage's "
                    f"elements (zero or overlapping strides): {t.numel() * t.element_size():,} "
                    f"bytes described by {t.untyped_storage().nbytes():,} stored")
        reach += (sz - 1) * st
    if t.numel() == 0:
        return None
    need = (t.storage_offset() + reach + 1) * t.element_size()
    have = t.untyped_storage().nbytes()
    if need > have:
        return f"shape {list(t.shape)} needs {need:,} bytes of storage but the file holds {have:,}"
    return None


# -- side data -------------------------------------------------------------------

class SideBudget:
    """Items, depth and text bytes left for one file's side data."""

    def __init__(self):
        self.items = budget("QKVSCOPE_SIDE_ITEMS")
        self.depth = budget("QKVSCOPE_SIDE_DEPTH")
        self.bytes = budget("QKVSCOPE_SIDE_BYTES")

    def spend(self, depth: int, text: int = 0) -> None:
        if depth > self.depth:
            raise over("QKVSCOPE_SIDE_DEPTH", f"side data nested more than {self.depth} levels deep "
                                              f"(or a container that holds itself)")
        self.items -= 1
        if self.items < 0:
            raise over("QKVSCOPE_SIDE_ITEMS", "side data holds more values than allowed (a repeated "
                                              "container expands to every copy)")
        self.bytes -= text
        if self.bytes < 0:
            raise over("QKVSCOPE_SIDE_BYTES", "side data holds more bytes of text than allowed")


# -- YAML ----------------------------------------------------------------------

def load_yaml(path: Path):
    """``yaml.safe_load`` of a config file within the budgets.

    The file may hold at most ``QKVSCOPE_YAML_BYTES``; while composing, every
    node counts once and every alias counts the full size of what it names
    (so ``&a [*b, *b, ...]`` chains count what they expand to), against
    ``QKVSCOPE_SIDE_ITEMS``; nesting is bounded by ``QKVSCOPE_SIDE_DEPTH``.
    Raises ``BudgetExceeded`` before the expansion is built, ``yaml.YAMLError``
    and ``UnicodeDecodeError`` for broken files.
    """
    import yaml  # here: only a YAML file needs it
    from yaml.events import AliasEvent
    from yaml.nodes import MappingNode, SequenceNode

    cap = budget("QKVSCOPE_YAML_BYTES")
    with open(path, "rb") as f:
        raw = f.read(cap + 1)
    if len(raw) > cap:
        raise over("QKVSCOPE_YAML_BYTES", f"YAML file is larger than {cap:,} bytes")
    text = raw.decode("utf-8")

    items, depth_cap = budget("QKVSCOPE_SIDE_ITEMS"), budget("QKVSCOPE_SIDE_DEPTH")

    class BoundedLoader(yaml.SafeLoader):
        def __init__(self, stream):
            super().__init__(stream)
            self._left, self._depth, self._sizes = items, 0, {}

        def _size(self, node) -> int:
            # expanded node count of an already composed node (a DAG; memoised by id)
            key = id(node)
            if key not in self._sizes:
                if isinstance(node, SequenceNode):
                    self._sizes[key] = 1 + sum(self._size(v) for v in node.value)
                elif isinstance(node, MappingNode):
                    self._sizes[key] = 1 + sum(self._size(k) + self._size(v) for k, v in node.value)
                else:
                    self._sizes[key] = 1
            return self._sizes[key]

        def compose_node(self, parent, index):
            if self.check_event(AliasEvent):
                node = self.anchors.get(self.peek_event().anchor)
                cost = self._size(node) if node is not None else 1
            else:
                cost = 1
            self._left -= cost
            if self._left < 0:
                raise over("QKVSCOPE_SIDE_ITEMS", "YAML expands (aliases counted in full) to more "
                                                  "values than allowed")
            self._depth += 1
            if self._depth > depth_cap:
                raise over("QKVSCOPE_SIDE_DEPTH", f"YAML nested more than {depth_cap} levels deep")
            try:
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

    loader = BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def walk_plain(v, spend, depth: int = 0) -> None:
    """Visit every value of a loaded YAML/JSON document once per occurrence,
    charging ``spend(depth, text_bytes)`` (a ``SideBudget.spend``)."""
    if isinstance(v, Mapping):
        spend(depth)
        for k, x in v.items():
            walk_plain(k, spend, depth + 1)
            walk_plain(x, spend, depth + 1)
    elif isinstance(v, (list, tuple, set, frozenset)):
        spend(depth)
        for x in v:
            walk_plain(x, spend, depth + 1)
    else:
        spend(depth, len(v) if isinstance(v, (str, bytes)) else 0)
