"""Export stored trajectories as SFT / DPO / KTO / rollout datasets, streamed as JSONL or Parquet.

Rows are read one keyset page of whole groups at a time (``service.export.repository``), each page in a
short transaction of its own that ends before anything is sent: a client that reads slowly, or never, holds
no connection and no open transaction, and the stream ends when it goes. Rows are grouped per group, turned
into records (``export_formats``) and written in batches of ``batch_rows``: memory is constant in the number
of rows. (Pages are not one snapshot: a group whose status changes during an export is in it or not, never
in part.) Parquet columns have one fixed schema per format
(what ``datasets.load_dataset("parquet", ...)`` and TRL's trainers read); free-form JSON (``tools``,
``metadata``) is a JSON string there and a JSON value in JSONL. Tool-call ``arguments`` exported as objects
are Arrow's canonical JSON extension type (``arrow.json``) in Parquet, which ``datasets`` (``Json``) reads
back as the object; token ids, log-probs and loss masks are Parquet lists (int32, float32, uint8).
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
from service.archive import service as archive
from service.export import repository as repo
from service.export.formats import FORMATS, Options
from service.export.schemas import ExportQuery

SCORED_STATUSES = ("scored", "ready", "dropped", "leased", "consumed")
MEDIA_TYPES = {"jsonl": "application/x-ndjson", "parquet": "application/vnd.apache.parquet"}

def _messages_type(arguments: pa.DataType) -> pa.DataType:
    tool_call = pa.struct([("id", pa.string()), ("type", pa.string()),
                           ("function", pa.struct([("name", pa.string()), ("arguments", arguments)]))])
    return pa.list_(pa.struct([("role", pa.string()), ("content", pa.string()), ("tool_calls", pa.list_(tool_call)),
                               ("tool_call_id", pa.string()), ("name", pa.string())]))


_REWARD = pa.struct([("component", pa.string()), ("value", pa.float64()), ("error", pa.string())])
_CHAT = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))


def _segment_type(messages: pa.DataType) -> pa.DataType:
    return pa.struct([("segment_index", pa.int32()), ("is_last", pa.bool_()), ("seq_len", pa.int64()),
                      ("messages", messages), ("advantage", pa.float64())])


def schema(fmt: str, arguments: pa.DataType = pa.string()) -> pa.Schema:
    """The Parquet schema of ``fmt``; ``arguments``: the tool-call arguments' type (``pa.json_()`` for
    objects, ``pa.string()`` for the stored text)."""
    messages = _messages_type(arguments)
    return {
        "sft": lambda: pa.schema([("messages", messages), ("tools", pa.string())]),
        "dpo": lambda: pa.schema([("prompt", messages), ("chosen", messages), ("rejected", messages)]),
        "kto": lambda: pa.schema([("prompt", messages), ("completion", messages), ("label", pa.bool_())]),
        "rollouts": lambda: pa.schema([
            ("uid", pa.string()), ("group_id", pa.string()), ("index", pa.int32()), ("prompt_id", pa.string()),
            ("dataset", pa.string()), ("policy_version", pa.int64()), ("group_status", pa.string()),
            ("reward_spec", pa.string()), ("prompt", messages), ("messages", messages),
            ("final_answer", pa.string()), ("finish_reason", pa.string()), ("num_tokens", pa.int64()),
            ("num_turns", pa.int32()), ("total_reward", pa.float64()), ("outcome", pa.float64()),
            ("advantage", pa.float64()), ("action", pa.string()), ("reason", pa.string()),
            ("rewards", pa.list_(_REWARD)), ("metadata", pa.string()), ("token_ids", pa.list_(pa.int32())),
            ("logprobs", pa.list_(pa.float32())), ("loss_mask", pa.list_(pa.uint8())),
            ("segments", pa.list_(_segment_type(messages))),  # null: not segmented
        ]),
        # verl's RL dataset layout (RLHFDataset: prompt_key "prompt", reward_model.ground_truth, extra_info)
        "verl": lambda: pa.schema([
            ("data_source", pa.string()), ("prompt", _CHAT), ("ability", pa.string()),
            ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
            ("extra_info", pa.struct([("index", pa.int64()), ("prompt_id", pa.string()), ("split", pa.string()),
                                      ("prompt", _CHAT), ("reference", pa.string())])),
        ]),
    }[fmt]()


SCHEMAS = {fmt: schema(fmt) for fmt in FORMATS}  # tool-call arguments as text
_JSON_COLUMNS = {"sft": ("tools",), "rollouts": ("metadata",)}
_MESSAGE_COLUMNS = {"sft": ("messages",), "dpo": ("prompt", "chosen", "rejected"), "kto": ("prompt", "completion"),
                    "rollouts": ("prompt", "messages")}


def check_query(q: ExportQuery) -> list[str]:
    """The statuses to read; 422 naming the field for an unknown status or an empty version range."""
    statuses = q.statuses or list(SCORED_STATUSES)
    for i, s in enumerate(statuses):
        if s not in GROUP_STATUSES:
            raise BadRequest(f"statuses[{i}]: unknown status {s!r}; valid: {', '.join(GROUP_STATUSES)}")
    lo, hi = q.min_policy_version, q.max_policy_version
    if lo is not None and hi is not None and lo > hi:
        raise BadRequest(f"min_policy_version: {lo} is above max_policy_version {hi}")
    if q.format == "verl" and q.include_archived:
        raise BadRequest("include_archived: does not apply to format=verl (archived rows keep no prompt reference)")
    if q.format == "verl" and q.min_reward is not None:
        raise BadRequest("min_reward: does not apply to format=verl (one row per prompt, not per trajectory)")
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
            pks = repo.group_page(session, after_pk=after, max_rows=batch_rows, **filters,
                                  max_bytes=batch_bytes if q.format != "verl" else None)  # verl reads no member
            page = repo.page_rows(session, pks, statuses=statuses, with_rewards=q.format == "rollouts",
                                  with_arrays=q.format == "rollouts", with_reference=q.format == "verl",
                                  members=q.format != "verl") if pks else []  # verl: a row per prompt
        if not pks:
            break
        yield from page
        after = pks[-1]
    if q.include_archived:
        yield from archive.archived_rows(factory, **filters)


def records(factory: sessionmaker[Session], q: ExportQuery, batch_rows: int,
            batch_bytes: int | None = None) -> Iterator[dict[str, Any]]:
    """The export's records in group order (a generator: pages are read as records are consumed)."""
    make, opts = FORMATS[q.format], Options(q.format, q.min_reward, q.correct_threshold, q.tool_arguments)
    grouped = itertools.groupby(rows(factory, q, batch_rows, batch_bytes), key=lambda r: r["group_pk"])
    out = (rec for _, group in grouped for rec in make(list(group), opts))
    return itertools.islice(out, q.limit) if q.limit is not None else out


def _batched(items: Iterable[Any], n: int) -> Iterator[list[Any]]:
    it = iter(items)
    while chunk := list(itertools.islice(it, n)):
        yield chunk


def _jsonl(recs: Iterator[dict[str, Any]], batch_rows: int) -> Iterator[bytes]:
    for chunk in _batched(recs, batch_rows):
        yield b"".join(orjson.dumps(r, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n" for r in chunk)


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


def _json_arguments(ms: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Messages whose tool-call arguments (objects, or text kept as text) are JSON text, for the JSON column."""
    if ms is None:
        return None
    out = []
    for m in ms:
        calls = m.get("tool_calls")
        if calls:
            calls = [{**c, "function": {**c["function"], "arguments": orjson.dumps(c["function"]["arguments"]).decode()}}
                     for c in calls]
            m = {**m, "tool_calls": calls}
        out.append(m)
    return out


def _table(fmt: str, chunk: list[dict[str, Any]], as_objects: bool = False) -> pa.Table:
    cols = _JSON_COLUMNS.get(fmt, ())
    messages = _MESSAGE_COLUMNS.get(fmt, ()) if as_objects else ()
    rows = [{**r, **{c: None if r.get(c) is None else orjson.dumps(r[c]).decode() for c in cols},
             **{c: _json_arguments(r.get(c)) for c in messages}} for r in chunk]
    table = pa.Table.from_pylist(rows, schema=SCHEMAS[fmt])  # arguments as JSON text ...
    return table.cast(schema(fmt, pa.json_())) if as_objects else table  # ... then typed as JSON


def _parquet(fmt: str, recs: Iterator[dict[str, Any]], batch_rows: int, as_objects: bool) -> Iterator[bytes]:
    sink = _Sink()
    target = schema(fmt, pa.json_()) if as_objects else SCHEMAS[fmt]
    with pq.ParquetWriter(pa.PythonFile(sink, mode="w"), target) as writer:
        for chunk in _batched(recs, batch_rows):
            writer.write_table(_table(fmt, chunk, as_objects))
            yield sink.take()
    yield sink.take()


def encode(fmt: str, filetype: str, recs: Iterator[dict[str, Any]], batch_rows: int,
           tool_arguments: str = "string") -> Iterator[bytes]:
    """``tool_arguments``: how the records hold tool-call arguments ("object": objects, or text kept as text)."""
    if filetype == "parquet":
        return _parquet(fmt, recs, batch_rows, tool_arguments == "object" and fmt in _MESSAGE_COLUMNS)
    return _jsonl(recs, batch_rows)


def stream(factory: sessionmaker[Session], q: ExportQuery, filetype: str, batch_rows: int,
           batch_bytes: int | None = None) -> Iterator[bytes]:
    """The whole export as byte chunks, read page by page in short sessions of its own (it outlives the
    request's session). ``check_query`` runs first, so bad filters fail before anything is sent."""
    check_query(q)
    return encode(q.format, filetype, records(factory, q, batch_rows, batch_bytes), batch_rows, q.tool_arguments)


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

