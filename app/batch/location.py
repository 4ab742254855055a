"""Where batch results live: a local folder or an object-storage URL (``ResultsLocation``).

One result is one folder per checkpoint, metric version and kind::

    <results>/checkpoint=<sha256>/metric_version=<v>/kind=<weights|activations>/
        part.parquet               the rows of a whole-checkpoint task
        job.parquet                its completion marker (written last)
        part-L<first>-<last>.parquet, job-L<first>-<last>.parquet   one layer group's pair

Object storage: ``s3://`` (also ``gs://``, ``r2://``) results are read and
written by DuckDB's ``httpfs`` extension (``INSTALL httpfs; LOAD httpfs``,
which needs network access once to download the extension). Credentials come
from the usual ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_REGION`` / ``AWS_DEFAULT_REGION`` and
``AWS_ENDPOINT_URL`` environment variables (a ``config`` secret), or, when no
key is set, the AWS SDK credential chain (DuckDB's ``aws`` extension). Workers
need the same variables. The statements themselves are in ``loaders.batch_results``.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import duckdb
import pandas as pd

from analysis.registry import METRIC_VERSION
from app.batch.errors import BatchError
from loaders import batch_results as sql
from loaders import duck

#: URL schemes DuckDB's httpfs extension reads and writes.
REMOTE_SCHEMES = ("s3://", "s3a://", "gs://", "gcs://", "r2://")
#: Files a result folder holds: ``part.parquet``/``job.parquet`` and, per layer group,
#: ``part-L0000-0003.parquet``/``job-L0000-0003.parquet`` (first and last layer).
RESULT_FILE = re.compile(r"(part|job)(-L\d{4,}-\d{4,})?\.parquet")


def group_tag(layers: tuple[int, int] | None) -> str:
    """``-L0004-0007`` for layers [4, 8) (first and last layer), ``''`` for the whole checkpoint."""
    return "" if layers is None else f"-L{layers[0]:04d}-{layers[1] - 1:04d}"


class ResultsLocation:
    """A results root: a local folder or an object-storage URL (``s3://bucket/prefix``), at one
    metric version (default: ``analysis.registry.METRIC_VERSION``; a batch reads it once, at its start).

    ``part(sha, kind)`` and ``job(sha, kind)`` name the two files of one result;
    ``exists``, ``write`` and ``prepare`` hide the local/remote difference.
    """

    def __init__(self, root: str | Path, metric_version: int | None = None):
        text = str(root)
        self.remote = text.startswith(REMOTE_SCHEMES)
        if self.remote:
            self.root = text.rstrip("/")
        else:
            self.root = str(Path(text).expanduser().resolve())
        if not duck.GLOB_CHARS.isdisjoint(self.root):   # DuckDB would read it as a pattern
            raise BatchError(f"{self.root}: expected a results location without any of "
                             f"{''.join(sorted(duck.GLOB_CHARS))} (DuckDB reads them as a file pattern)")
        self.metric_version = METRIC_VERSION if metric_version is None else metric_version

    def __repr__(self) -> str:
        return f"ResultsLocation({self.root!r})"

    def folder(self, sha256: str, kind: str) -> str:
        return f"{self.root}/checkpoint={sha256}/metric_version={self.metric_version}/kind={kind}"

    def part(self, sha256: str, kind: str, layers: tuple[int, int] | None = None) -> str:
        """The rows of a whole-checkpoint task, or with ``layers`` ([start, stop)) of one layer group."""
        return f"{self.folder(sha256, kind)}/part{group_tag(layers)}.parquet"

    def job(self, sha256: str, kind: str, layers: tuple[int, int] | None = None) -> str:
        """The checkpoint's completion marker, or with ``layers`` the marker of one layer group."""
        return f"{self.folder(sha256, kind)}/job{group_tag(layers)}.parquet"

    def parts_glob(self, sha256: str, kind: str) -> str:
        """Every layer-group part of one checkpoint and kind, as a DuckDB glob."""
        return f"{self.folder(sha256, kind)}/part-L*.parquet"

    def remove_stale(self, sha256: str, kind: str, groups: list[tuple[int, int]] | None) -> None:
        """Delete the part and job files of this result that belong neither to ``groups`` nor,
        with ``groups`` None, to the whole-checkpoint task: those an earlier run with other
        layer groups left, so ``**/part*.parquet`` reads each row once. Local folders only:
        DuckDB cannot delete objects, so a bucket keeps them (registration reads only the
        parts that ``job.parquet`` lists)."""
        if self.remote:
            return
        keep = {"job.parquet"} | {Path(f(sha256, kind, g)).name for g in (groups or [None])
                                  for f in (self.part, self.job)}
        for f in Path(self.folder(sha256, kind)).glob("*.parquet"):
            if f.name not in keep and RESULT_FILE.fullmatch(f.name):
                f.unlink(missing_ok=True)

    def prepare(self, con: duckdb.DuckDBPyConnection) -> None:
        """Make ``con`` able to read and write this location (httpfs + credentials for URLs)."""
        if not self.remote:
            return
        try:
            sql.load_httpfs(con)
        except duckdb.Error as exc:
            raise BatchError(f"{self.root}: object-storage results need DuckDB's httpfs extension, "
                             f"which could not be installed or loaded ({exc})") from exc
        key = os.environ.get("AWS_ACCESS_KEY_ID")
        if key:
            sql.create_s3_secret(con, key_id=key, secret=os.environ.get("AWS_SECRET_ACCESS_KEY", ""),
                                 session_token=os.environ.get("AWS_SESSION_TOKEN"),
                                 endpoint=os.environ.get("AWS_ENDPOINT_URL"),
                                 region=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"))
        else:
            try:
                sql.create_credential_chain_secret(con)
            except duckdb.Error as exc:
                raise BatchError(f"{self.root}: no AWS_ACCESS_KEY_ID in the environment and the AWS "
                                 f"credential chain is unavailable ({exc})") from exc

    def exists(self, url: str, con: duckdb.DuckDBPyConnection | None = None) -> bool:
        if not self.remote:
            return Path(url).is_file()
        own = con is None
        con = con or duck.connect()
        try:
            if own:
                self.prepare(con)
            return sql.file_exists(con, url)
        finally:
            if own:
                con.close()

    def write(self, con: duckdb.DuckDBPyConnection, frame: pd.DataFrame, url: str) -> None:
        """Write ``frame`` as Parquet at ``url``; a local file appears whole or not at all."""
        if self.remote:
            sql.copy_to_parquet(con, frame, url)
            return
        final = Path(url)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        sql.copy_to_parquet(con, frame, str(tmp))
        os.replace(tmp, final)
