"""What one ingest did, file by file: the report the CLI prints and the page shows."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class FileReport:
    """The outcome of ingesting one file.

    ``status``: ``added`` (new content stored), ``appended`` (a grown log's new
    points), ``unchanged`` (already stored, nothing added), ``skipped``
    (not something qkvscope reads; ``reason`` says why) or ``error`` (it should
    have been readable but is broken; ``reason`` is the typed error's message).
    """

    path: str
    kind: str                     # 'checkpoint', 'log' or 'unknown'
    status: str
    format: str | None = None
    reason: str | None = None
    run_ids: list[int] = field(default_factory=list)
    checkpoint_id: int | None = None
    n_points: int = 0

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class IngestReport:
    files: list[FileReport] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(1 for f in self.files if f.status == status)

    def to_json(self) -> dict:
        return {
            "added": self.count("added"), "appended": self.count("appended"),
            "unchanged": self.count("unchanged"), "skipped": self.count("skipped"),
            "errors": self.count("error"),
            "files": [f.to_json() for f in self.files],
        }
