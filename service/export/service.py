"""Export stored trajectories as SFT / DPO / KTO / rollout datasets, streamed as JSONL or Parquet.

Rows are read one keyset page of whole groups at a time (``service.export.repository``), each page in a
short transaction of its own that ends before anything is sent: a client that reads slowly, or never, holds
no connection and no open transaction, and the stream ends when it goes. Rows are grouped per group, turned
into records (``export_formats``) and written in batches of ``batch_rows``: memory is constant in the number
of rows. (Pages are not one snapshot: a group whose status changes during an export is in it or not, never
in part.) Parquet columns have one fixed schema per format
(what ``datasets.load_dataset("parquet", ...)`` and TRL's trainers read); free-form JSON (``tools``,
``metadata``) is a JSON string there and a JSON value in JSONL.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy.orm import Session, sessionmaker

from service.api.errors import BadRequest, ServiceError
from service.api.schemas import GROUP_STATUSES
from service.export import repository as repo
from service.export.formats import FORMATS, Options
from service.export.schemas import ExportQuery

SCORED_STATUSES = ("scored", "ready", "dropped", "leased", "consumed")
MEDIA_TYPES = {"jsonl": "application/x-ndjson", "parquet": "application/vnd.apache.parquet"}

_TOOL_CALL = pa.struct([("id", pa.string()), ("type", pa.string()),
                        ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())]))])
MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string()), ("tool_calls", pa.list_(_TOOL_CALL)),
                     ("tool_call_id", pa.string()), ("name", pa.string())])
MESSAGES = pa.list_(MESSAGE)
_REWARD = pa.struct([("component", pa.string()), ("value", pa.float64()), ("error", pa.string())])
SCHEMAS = {
    "sft": pa.schema([("messages", MESSAGES), ("tools", pa.string())]),
    "dpo": pa.schema([("prompt", MESSAGES), ("chosen", MESSAGES), ("rejected", MESSAGES)]),
    "kto": pa.schema([("prompt", MESSAGES), ("completion", MESSAGES), ("label", pa.bool_())]),
    "rollouts": pa.schema([
        ("uid", pa.string()), ("group_id", pa.string()), ("index", pa.int32()), ("prompt_id", pa.string()),
        ("dataset", pa.string()), ("policy_version", pa.int64()), ("group_status", pa.string()),
        ("reward_spec", pa.string()), ("prompt", MESSAGES), ("messages", MESSAGES), ("final_answer", pa.string()),
        ("finish_reason", pa.string()), ("num_tokens", pa.int64()), ("num_turns", pa.int32()),
        ("total_reward", pa.float64()), ("outcome", pa.float64()), ("advantage", pa.float64()),
        ("action", pa.string()), ("reason", pa.string()), ("rewards", pa.list_(_REWARD)), ("metadata", pa.string()),
    ]),
}
_JSON_COLUMNS = {"sft": ("tools",), "rollouts": ("metadata",)}


def check_query(q: ExportQuery) -> list[str]:
    """The statuses to read; 422 naming the field for an unknown status or an empty version range."""
    statuses = q.statuses or list(SCORED_STATUSES)
    for i, s in enumerate(statuses):
        if s not in GROUP_STATUSES:
            raise BadRequest(f"statuses[{i}]: unknown status {s!r}; valid: {', '.join(GROUP_STATUSES)}")
    lo, hi = q.min_policy_version, q.max_policy_version
    if lo is not None and hi is not None and lo > hi:
        raise BadRequest(f"min_policy_version: {lo} is above max_policy_version {hi}")
    return statuses


def rows(factory: sessionmaker[Session], q: ExportQuery, batch_rows: int,
         batch_bytes: int | None = None) -> Iterator[dict[str, Any]]:
    """The export's rows in group order, a page (about ``batch_rows`` rows and ``batch_bytes`` bytes of
    trajectory JSON, whole groups) per short session."""
    statuses = check_query(q)
    filters = {"dataset": q.dataset, "min_policy_version": q.min_policy_version,
               "max_policy_version": q.max_policy_version, "statuses": statuses}
    after = 0
    while True:
        with factory() as session, session.begin():
            pks = repo.group_page(session, after_pk=after, max_rows=batch_rows, max_bytes=batch_bytes, **filters)
            page = repo.page_rows(session, pks, statuses=statuses, with_rewards=q.format == "rollouts") if pks else []
        if not pks:
            return
        yield from page
        after = pks[-1]


def records(factory: sessionmaker[Session], q: ExportQuery, batch_rows: int,
            batch_bytes: int | None = None) -> Iterator[dict[str, Any]]:
    """The export's records in group order (a generator: pages are read as records are consumed)."""
    make, opts = FORMATS[q.format], Options(q.format, q.min_reward, q.correct_threshold)
    grouped = itertools.groupby(rows(factory, q, batch_rows, batch_bytes), key=lambda r: r["group_pk"])
    out = (rec for _, group in grouped for rec in make(list(group), opts))
    return itertools.islice(out, q.limit) if q.limit is not None else out


def _batched(items: Iterable[Any], n: int) -> Iterator[list[Any]]:
    it = iter(items)
    while chunk := list(itertools.islice(it, n)):
        yield chunk


def _jsonl(recs: Iterator[dict[str, Any]], batch_rows: int) -> Iterator[bytes]:
    for chunk in _batched(recs, batch_rows):
        yield b"".join(orjson.dumps(r) + b"\n" for r in chunk)


class _Sink:
    """A write-only file for pyarrow that hands its bytes to the caller after each row group."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.pos, self.closed = 0, False

    def write(self, data: Any) -> int:
        b = bytes(data)
        self.parts.append(b)
        self.pos += len(b)
        return len(b)

    def tell(self) -> int:
        return self.pos

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def take(self) -> bytes:
        out, self.parts = b"".join(self.parts), []
        return out


def _table(fmt: str, chunk: list[dict[str, Any]]) -> pa.Table:
    cols = _JSON_COLUMNS.get(fmt, ())
    rows = [{**r, **{c: None if r.get(c) is None else orjson.dumps(r[c]).decode() for c in cols}} for r in chunk]
    return pa.Table.from_pylist(rows, schema=SCHEMAS[fmt])


def _parquet(fmt: str, recs: Iterator[dict[str, Any]], batch_rows: int) -> Iterator[bytes]:
    sink = _Sink()
    with pq.ParquetWriter(pa.PythonFile(sink, mode="w"), SCHEMAS[fmt]) as writer:
        for chunk in _batched(recs, batch_rows):
            writer.write_table(_table(fmt, chunk))
            yield sink.take()
    yield sink.take()


def encode(fmt: str, filetype: str, recs: Iterator[dict[str, Any]], batch_rows: int) -> Iterator[bytes]:
    return _parquet(fmt, recs, batch_rows) if filetype == "parquet" else _jsonl(recs, batch_rows)


def stream(factory: sessionmaker[Session], q: ExportQuery, filetype: str, batch_rows: int,
           batch_bytes: int | None = None) -> Iterator[bytes]:
    """The whole export as byte chunks, read page by page in short sessions of its own (it outlives the
    request's session). ``check_query`` runs first, so bad filters fail before anything is sent."""
    check_query(q)
    return encode(q.format, filetype, records(factory, q, batch_rows, batch_bytes), batch_rows)


class TooManyExports(ServiceError):
    """429: the process streams ``limit`` exports already."""

    status_code = 429

    def __init__(self, limit: int, retry_after_s: float) -> None:
        super().__init__(f"export: {limit} exports are streaming in this process, the limit of "
                         f"export_max_concurrent={limit}; retry after {retry_after_s:g} s",
                         detail={"limit": limit, "setting": "export_max_concurrent", "retry_after_s": retry_after_s})
        self.headers = {"Retry-After": str(max(1, round(retry_after_s)))}


class ExportSlots:
    """At most ``limit`` exports streaming at once in a process (each holds up to a page in memory)."""

    def __init__(self, limit: int, retry_after_s: float = 5.0) -> None:
        self.limit, self.retry_after_s = limit, retry_after_s
        self.streaming = 0
        self._lock = threading.Lock()

    def guard(self, chunks: Iterator[bytes]) -> Iterator[bytes]:
        """A slot for ``chunks`` (429 when none is free), given back when the stream ends, fails or is closed
        (the response closes it when it ends, however it ends: ``service.export.router``), or is dropped
        unstarted."""
        with self._lock:
            if self.streaming >= self.limit:
                raise TooManyExports(self.limit, self.retry_after_s)
            self.streaming += 1
        return _Guarded(chunks, self._release)

    def _release(self) -> None:
        with self._lock:
            self.streaming -= 1


class _Guarded:
    def __init__(self, chunks: Iterator[bytes], release: Any) -> None:
        self._chunks, self._release, self._done = chunks, release, False
        self._lock = threading.Lock()

    def __iter__(self) -> _Guarded:
        return self

    def __next__(self) -> bytes:
        try:
            return next(self._chunks)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        try:
            close = getattr(self._chunks, "close", None)
            if close is not None:
                close()
        except ValueError:  # a page is being read in a thread right now: that thread finishes it, then stops
            pass
        finally:
            self._release()

    def __del__(self) -> None:
        self.close()

