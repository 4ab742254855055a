"""Rebuild data/corpus/austen-persuasion.txt from Debian's r-cran-janeaustenr.

Usage (see SOURCES.md for the whole recipe and the checksums):

    apt-get download r-cran-janeaustenr          # 1.0.0-1, all
    dpkg-deb -x r-cran-janeaustenr_1.0.0-1_all.deb pkg
    python data/corpus/extract_janeaustenr.py \
        pkg/usr/lib/R/site-library/janeaustenr/data/Rdata persuasion \
        data/corpus/austen-persuasion.txt

The package keeps each novel as an R character vector (one element per line
of the Project Gutenberg text) in R's lazy-load database ``Rdata.rdb``, whose
index ``Rdata.rdx`` is a gzip-compressed serialized list of (offset, length)
per variable; each record is a 4-byte big-endian length and a zlib stream
holding one object in R's XDR serialization ("Writing R Extensions" and
R Internals, "Serialization formats"). This reader knows only the few
SEXP types those two files use and fails on anything else; it runs no R
code and evaluates nothing. The lines are written joined by "\\n", with a
final newline, unchanged otherwise.
"""
from __future__ import annotations

import gzip
import struct
import sys
import zlib

# SEXP type codes (R Internals, "SEXPTYPEs") and the serializer's pseudo-types.
SYMSXP, LISTSXP, CHARSXP, LGLSXP, INTSXP, REALSXP, STRSXP, VECSXP = 1, 2, 9, 10, 13, 14, 16, 19
REFSXP, NILVALUE_SXP = 255, 254
SPECIAL_ENVS = {253, 242, 241, 251, 247}  # global/empty/base env, missing arg, base namespace


class XdrReader:
    """Reads one object from R's XDR (big-endian) serialization."""

    def __init__(self, data: bytes):
        self.data, self.pos, self.refs = data, 0, []

    def _int(self) -> int:
        (value,) = struct.unpack_from(">i", self.data, self.pos)
        self.pos += 4
        return value

    def _bytes(self, n: int) -> bytes:
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def read(self):
        if self._bytes(2) != b"X\n":
            raise ValueError("not an XDR serialization")
        version = self._int()
        self._int(), self._int()  # writer's R version, minimal reader version
        if version == 3:
            self._bytes(self._int())  # native encoding name
        return self._item()

    def _item(self):
        flags = self._int()
        kind = flags & 0xFF
        has_attr, has_tag = flags & (1 << 9), flags & (1 << 10)
        if kind == NILVALUE_SXP:
            return None
        if kind in SPECIAL_ENVS:
            return ("special", kind)
        if kind == REFSXP:
            index = flags >> 8 or self._int()
            return self.refs[index - 1]
        if kind == SYMSXP:
            sym = ("sym", self._item())
            self.refs.append(sym)
            return sym
        if kind == CHARSXP:
            n = self._int()
            return None if n == -1 else self._bytes(n).decode("utf-8")
        if kind == LISTSXP:
            if has_attr:
                self._item()
            tag = self._item() if has_tag else None
            car, cdr = self._item(), self._item()
            return [(tag[1] if tag else None, car)] + (cdr if isinstance(cdr, list) else [])
        n = self._int()
        if kind in (STRSXP, VECSXP):
            value = [self._item() for _ in range(n)]
        elif kind in (LGLSXP, INTSXP):
            value = list(struct.unpack(f">{n}i", self._bytes(4 * n)))
        elif kind == REALSXP:
            value = list(struct.unpack(f">{n}d", self._bytes(8 * n)))
        else:
            raise ValueError(f"SEXP type {kind} at byte {self.pos} is not supported")
        attrs = dict(self._item()) if has_attr else {}
        return dict(zip(attrs["names"], value)) if "names" in attrs else value


def read_variable(base: str, name: str) -> list[str]:
    """The character vector ``name`` of the lazy-load database ``base``.rdb/.rdx."""
    with open(base + ".rdx", "rb") as f:
        index = XdrReader(gzip.decompress(f.read())).read()
    offset, length = index["variables"][name]
    with open(base + ".rdb", "rb") as f:
        f.seek(offset)
        record = f.read(length)
    value = XdrReader(zlib.decompress(record[4:])).read()
    if not isinstance(value, list) or not all(isinstance(s, str) or s is None for s in value):
        raise ValueError(f"{name} is not a character vector")
    return ["" if s is None else s for s in value]


def main(argv: list[str]) -> None:
    base, name, out = argv
    lines = read_variable(base, name)
    with open(out, "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{out}: {len(lines)} lines")


if __name__ == "__main__":
    main(sys.argv[1:])
