"""Archive files: where they go (a directory or ``s3://bucket/prefix``), their Parquet schema, and how one is
written so that a reader never sees a part of one.

Layout: ``<to>/<kind>/dataset=<name>/date=<YYYY-MM-DD>/part-<owner>-<first pk>-<last pk>.parquet``, kind ``all``
(every trajectory of the archived groups) or ``effective`` (the trajectories a trainer trained on: members
of consumed groups that curation kept). One row per trajectory; free-form JSON (messages, metadata,
rewards, segments) is JSON text; token ids / loss masks / log-probs / versions are Parquet lists of the
stored dtypes (int32, uint8, float32, int32), so they read back bit for bit. zstd compression.

``owner``: the writing database's archive id (``archive_identity``), so that databases sharing a target never
write the same name, and a database deletes as unrecorded only files that carry its own id.

A local file is written under a temporary name in ``<to>/_tmp/`` (outside the Hive tree, and not ``.parquet``:
a reader of ``<to>/all`` or of ``<to>/**/*.parquet`` never sees a partial file), fsynced, renamed into place
and its directory fsynced; an S3 object appears whole when its upload completes. A file name depends only on
the owner and the batch (its first and last group pk), so a batch written again after a crash overwrites the
same file.
"""

from __future__ import annotations

import os
import posixpath
import re
import uuid
from dataclasses import dataclass
from datetime import date
from typing import Any
from urllib.parse import quote, urlsplit

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from service.store import arrays

KINDS = ("all", "effective")
TMP_DIR = "_tmp"  # under the target's root: temporary files, outside the Hive tree
_OWNER = re.compile(r"^[0-9a-f]{8,32}$")
_JSON = ("messages", "metadata", "segments", "segment_advantages", "rewards", "sampling", "group_metadata",
         "prompt_messages", "prompt_metadata")
_ARRAYS = {"token_ids": arrays.TOKEN_DTYPE, "loss_mask": arrays.MASK_DTYPE, "logprobs": arrays.LOGPROB_DTYPE,
           "versions": arrays.VERSION_DTYPE}

SCHEMA = pa.schema([
    ("group_pk", pa.int64()), ("group_id", pa.string()), ("prompt_id", pa.string()), ("dataset", pa.string()),
    ("policy_version", pa.int64()), ("status", pa.string()), ("drop_reason", pa.string()),
    ("created_at", pa.timestamp("us", tz="UTC")), ("consumed_at", pa.timestamp("us", tz="UTC")),
    ("reward_spec_name", pa.string()), ("reward_spec_version", pa.int32()),
    ("curation_policy_name", pa.string()), ("curation_policy_version", pa.int32()),
    ("sampling", pa.string()), ("group_metadata", pa.string()),
    ("prompt_messages", pa.string()), ("prompt_metadata", pa.string()),
    ("index", pa.int32()), ("messages", pa.string()), ("final_answer", pa.string()), ("finish_reason", pa.string()),
    ("seq_len", pa.int64()), ("num_tokens", pa.int64()), ("num_turns", pa.int32()), ("metadata", pa.string()),
    ("total_reward", pa.float64()), ("outcome", pa.float64()), ("advantage", pa.float64()),
    ("action", pa.string()), ("reason", pa.string()), ("segments", pa.string()), ("segment_advantages", pa.string()),
    ("rewards", pa.string()),
    ("token_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.uint8())), ("logprobs", pa.list_(pa.float32())),
    ("versions", pa.list_(pa.int32())),
])


@dataclass(frozen=True)
class Target:
    """Where archives go: ``url`` as given, the filesystem it names, its root path there."""

    url: str
    fs: pafs.FileSystem
    root: str  # local: the real path (symlinks resolved); S3: bucket/prefix, normalised
    s3: bool
    query: str
    owner: str  # the writing database's archive id

    @classmethod
    def parse(cls, url: str, owner: str) -> Target:
        """A local directory (created when missing) or ``s3://bucket/prefix`` (options of pyarrow's S3
        filesystem may follow as a query, e.g. ``?endpoint_override=host:port&scheme=http``)."""
        if not _OWNER.match(owner):
            raise ValueError(f"owner {owner!r}: expected the database's archive id (hex)")
        if url.startswith("s3://"):
            parts = urlsplit(url)
            if not parts.netloc:
                raise ValueError(f"--to {url!r}: an S3 URL names a bucket: s3://bucket/prefix")
            fs, root = pafs.FileSystem.from_uri(url)
            return cls(url, fs, posixpath.normpath("/" + root).strip("/"), True, parts.query, owner)
        if "://" in url:
            raise ValueError(f"--to {url!r}: expected a directory or s3://bucket/prefix")
        os.makedirs(url, exist_ok=True)
        return cls(url, pafs.LocalFileSystem(), os.path.realpath(url), False, "", owner)

    def path(self, kind: str, dataset: str, day: date, first_pk: int, last_pk: int) -> str:
        return (f"{self.root}/{kind}/dataset={_part(dataset)}/date={day.isoformat()}/"
                f"part-{self.owner}-{first_pk:019d}-{last_pk:019d}.parquet")

    def owns(self, path: str) -> bool:
        """Whether ``path``'s name says this target's owner wrote it."""
        return re.fullmatch(rf"part-{self.owner}-\d{{19}}-\d{{19}}\.parquet", posixpath.basename(path)) is not None

    def location(self, path: str) -> str:
        """A path on this target as clients see it (an S3 URL without the options, or the local path)."""
        return f"s3://{path}" if self.s3 else path

    def uri(self, path: str) -> str:
        """What ``open_file`` opens ``path`` with later (the options kept)."""
        if not self.s3:
            return path
        return f"s3://{quote(path, safe='/=@+')}" + (f"?{self.query}" if self.query else "")  # a URI: % escaped

    def write(self, path: str, table: pa.Table) -> None:
        if self.s3:  # an object appears whole when its upload completes
            pq.write_table(table, path, filesystem=self.fs, compression="zstd")
            return
        write_local(path, table, os.path.join(self.root, TMP_DIR), f"{self.owner}-")

    def stale_temps(self) -> list[str]:
        """This owner's temporary files left by a killed run (local targets; an S3 upload leaves none)."""
        if self.s3:
            return []
        tmp = os.path.join(self.root, TMP_DIR)
        names = os.listdir(tmp) if os.path.isdir(tmp) else []
        return [os.path.join(tmp, n) for n in names if n.startswith(f"{self.owner}-") and n.endswith(".partial")]

    def files(self) -> list[str]:
        """Every file under ``all/`` and ``effective/`` (paths on the filesystem)."""
        out = []
        for kind in KINDS:
            sel = pafs.FileSelector(f"{self.root}/{kind}", recursive=True, allow_not_found=True)
            out += [i.path for i in self.fs.get_file_info(sel) if i.type == pafs.FileType.File]
        return out

    def delete(self, path: str) -> None:
        self.fs.delete_file(path)


def _part(value: str) -> str:
    """A dataset name as a Hive partition value (``/`` and ``%`` escaped, as Hive does)."""
    return "".join(c if c.isalnum() or c in "-_.@+" else f"%{ord(c):02X}" for c in value)


def tail(location: str) -> str:
    """``<kind>/dataset=…/date=…/<name>`` of a path or location: the same file whichever way the root was
    spelled (a symlink, a moved mount, an S3 URL with or without options)."""
    return "/".join(location.split("?", 1)[0].rstrip("/").split("/")[-4:])


def write_local(path: str, table: pa.Table, tmp_dir: str, prefix: str = "") -> None:
    """Write ``table`` to ``path`` so that ``path`` is either absent, its old content or the whole new file.
    The temporary file lives in ``tmp_dir`` (on the same filesystem: the rename is atomic) as
    ``<prefix><random>.partial``, never beside ``path`` where a reader of the directory would find it."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    os.makedirs(tmp_dir, exist_ok=True)
    tmp = os.path.join(tmp_dir, f"{prefix}{uuid.uuid4().hex}.partial")
    try:
        with open(tmp, "wb") as f:
            pq.write_table(table, f, compression="zstd")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _json(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value).decode()


def table(rows: list[dict[str, Any]]) -> pa.Table:
    """Trajectory rows (``repository.group_rows``) as the archive's Arrow table."""
    cols: dict[str, list[Any]] = {f.name: [] for f in SCHEMA}
    for r in rows:
        for name in cols:
            key = "idx" if name == "index" else name
            value = r.get(key)
            if name in _JSON:
                value = _json(value)
            elif name in _ARRAYS:
                value = arrays.decode(value, _ARRAYS[name])
            cols[name].append(value)
    return pa.Table.from_pydict(cols, schema=SCHEMA)


def open_file(uri: str) -> pa.Table:
    """Read back a recorded file (``ArchiveFile.uri``)."""
    if uri.startswith("s3://"):
        fs, path = pafs.FileSystem.from_uri(uri)
        return pq.read_table(path, filesystem=fs, schema=SCHEMA)
    return pq.read_table(uri, schema=SCHEMA)


def export_rows(t: pa.Table) -> list[dict[str, Any]]:
    """An archived table as the export's trajectory rows (``service.export.repository.page_rows``' keys)."""
    out = []
    for r in t.to_pylist():
        row = {**r, "idx": r["index"], "group_status": r["status"]}
        for name in _JSON:
            row[name] = None if r[name] is None else orjson.loads(r[name])
        for name, dtype in _ARRAYS.items():
            row[name] = None if r[name] is None else np.asarray(r[name], dtype=dtype).tobytes()
        out.append(row)
    return out
