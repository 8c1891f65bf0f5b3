"""The Arrow body of ``POST /v1/groups`` (``Content-Type: application/vnd.apache.arrow.stream``): the same request
as the JSON body, with each trajectory's token arrays as Arrow columns instead of JSON numbers.

An Arrow IPC stream whose schema metadata ``grpo_curator.body`` holds the JSON body (one group, or
``{"groups": [...]}``) without the trajectories' ``token_ids``, ``loss_mask``, ``logprobs`` and ``versions``; its
record batches hold one row per trajectory, in the document's order (groups in order, each group's trajectories
by index), in the columns of those names: ``token_ids`` and ``versions`` lists of integers, ``loss_mask`` a list
of integers (uint8 is the natural one), ``logprobs`` a list of float32 or float64. A column may be left out and a
row may be null: that trajectory has no such array, as when the JSON leaves the key out. A segmented trajectory
(``segments``) is posted as JSON.

Decoding gives the document the JSON body parses to, with the arrays as numpy views of the body's buffers (the
log-probs as float64, the numbers a JSON body of the same values holds; a JSON ``null`` array is as good as none),
and ``GroupIn`` validates it with the same rules (``service.ingest.schemas``): no per-token Python, no JSON of 8 M
numbers to parse, check and hash.
The JSON part passes the same wire checks as a JSON body; the stream is refused when its buffers are compressed
(a few MB of zstd can claim GBs) or dictionary-encoded, and validated in full (offsets within their buffers)
before a value is read. Errors name the field (``columns.logprobs``, ``groups[0].trajectories[3].token_ids``).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from service.api.wire_checks import WireError, check_containers, parse_json_body

BODY_KEY = b"grpo_curator.body"
ARRAY_COLUMNS = ("token_ids", "loss_mask", "logprobs", "versions")
_FLOATS = frozenset({"logprobs"})
_WHAT = {"token_ids": "integers", "loss_mask": "integers", "logprobs": "float32 or float64", "versions": "integers"}
# Message flatbuffer (Arrow's format/Message.fbs): its header union's type and value are fields 1 and 2; a
# RecordBatch's ``compression`` is its field 3
_HEADER_TYPE, _HEADER, _COMPRESSION, _RECORD_BATCH = 1, 2, 3, 3
MAX_BATCHES = 10_000  # record batches in one body (each costs a read; a producer needs one)


def encode_groups(body: dict[str, Any]) -> bytes:
    """A JSON body (one group, or ``{"groups": [...]}``, as ``POST /v1/groups`` takes it) -> its Arrow body. Integer
    arrays go as int32 (uint8 for a 0/1 mask) when every value fits, else as int64 or uint64 (the service then names
    the value that does not fit); log-probs as float32 when each is a float32 value (a sampler's), else float64: the
    service stores the same bytes and hashes the same numbers as for the JSON body. ValueError, naming the field,
    for what the JSON body could not carry either (NaN or infinity in the JSON part, an array item that is not a
    number of its kind, an integer beyond 64 bits, a segmented trajectory)."""
    batched = "groups" in body
    doc = {**body, "groups": [dict(g) for g in body["groups"]]} if batched else dict(body)
    sources: list[tuple[str, dict[str, Any]]] = []
    for i, g in enumerate(doc["groups"] if batched else [doc]):
        where = f"groups[{i}]." if batched else ""
        sources += [(f"{where}trajectories[{j}]", t) for j, t in enumerate(g["trajectories"])]
        g["trajectories"] = [{k: v for k, v in t.items() if k not in ARRAY_COLUMNS} for t in g["trajectories"]]
    for where, t in sources:
        if t.get("segments") is not None:
            raise ValueError(f"{where}.segments: a segmented trajectory is posted as JSON")
    fields, columns = [], []
    for name in ARRAY_COLUMNS:
        values = [(f"{where}.{name}", t.get(name)) for where, t in sources]
        if all(v is None for _, v in values):
            continue
        column = _list_column(name, values)
        fields.append(pa.field(name, column.type))
        columns.append(column)
    # the JSON part as a JSON body would carry it: NaN and infinity refused (orjson would write them as null)
    text = json.dumps(doc, allow_nan=False, ensure_ascii=False, separators=(",", ":")).encode()
    schema = pa.schema(fields, metadata={BODY_KEY: text})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        if columns:  # no column: no row to send (the JSON holds everything)
            writer.write_batch(pa.record_batch(columns, schema=schema))
    return sink.getvalue().to_pybytes()


def _list_column(name: str, values: list[tuple[str, Any]]) -> pa.ListArray:
    """One column: each trajectory's array (or None) as a numpy array of the kind ``name`` holds, then the narrowest
    type every value of the column fits."""
    kinds = "fiu" if name in _FLOATS else "iu"
    arrays = []
    for field, v in values:
        if v is None:
            continue
        what = "numbers" if name in _FLOATS else "integers"
        if not isinstance(v, np.ndarray) and not set(map(type, v)) <= ({int, float} if name in _FLOATS else {int}):
            raise ValueError(f"{field}: not a list of {what}")  # None, bool (numpy makes 1 of True), str, a list
        a = np.asarray(v)
        if a.size and (a.ndim != 1 or a.dtype.kind not in kinds):
            if name in _FLOATS or isinstance(v, np.ndarray):
                raise ValueError(f"{field}: not a list of {what}")
            if not 0 <= min(v) <= max(v) < 2**64:  # ints past 64 bits are objects to numpy
                raise ValueError(f"{field}: values from {min(v)} to {max(v)} fit no 64-bit integer type")
            a = np.asarray(v, dtype=np.uint64)  # numpy makes float64 of small ints beside 2**64-1: exact now
        arrays.append(a.reshape(-1))
    full = [a for a in arrays if a.size]  # [] is float64 to numpy: an empty array takes the column's type
    if name in _FLOATS:
        flat = np.concatenate([a.astype(np.float64) for a in full]) if full else np.zeros(0, np.float64)
        as32 = flat.astype(np.float32)
        if np.array_equal(as32.astype(np.float64), flat, equal_nan=True):
            flat = as32
    else:
        lo = min((int(a.min()) for a in full), default=0)
        hi = max((int(a.max()) for a in full), default=0)
        target = next((t for t in (np.uint8, np.int32, np.int64, np.uint64) if (t is not np.uint8 or name == "loss_mask")
                       and np.iinfo(t).min <= lo and hi <= np.iinfo(t).max), None)
        if target is None:  # both a negative value and one above int64: no 64-bit type holds the column
            raise ValueError(f"{name}: values from {lo} to {hi} fit no 64-bit integer type")
        flat = np.concatenate([a.astype(target) for a in full]) if full else np.zeros(0, target)
    lengths = [0 if v is None else int(np.size(v)) for _, v in values]
    offsets = np.zeros(len(values) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    nulls = pa.array([v is None for _, v in values], pa.bool_())
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat), mask=nulls)


def decode_groups(raw: bytes, max_containers: int | None = None) -> Any:
    """The Arrow body -> the document its JSON twin parses to, each trajectory's arrays as numpy arrays (log-probs
    as float64). WireError (400 malformed, 413, 422) naming the field."""
    messages = _messages(raw)
    schema = _schema(next(messages, None))
    text = (schema.metadata or {}).get(BODY_KEY)
    if text is None:
        raise WireError(422, "body", f"the Arrow schema's metadata has no {BODY_KEY.decode()!r}: the request's JSON "
                                     "(one group or {\"groups\": [...]}) without its trajectories' token arrays")
    check_containers(text, max_containers)
    doc = parse_json_body(text)
    trajectories = _trajectories(doc)
    expected = None if trajectories is None or not schema.names else len(trajectories)
    columns = _columns(schema, messages, expected)
    if trajectories is not None:
        try:
            _attach(trajectories, columns)
        except (pa.ArrowException, OSError, ValueError) as exc:  # never here for a validated batch
            raise WireError(400, "body", f"not a valid Arrow record batch: {exc}") from None
    return doc


def _messages(raw: bytes) -> Iterator[pa.ipc.Message]:
    """The stream's messages, then a check that nothing follows its end (as nothing may follow a JSON document)."""
    source = pa.BufferReader(pa.py_buffer(raw))
    try:
        reader = pa.ipc.MessageReader.open_stream(source)
        while True:
            try:
                message = reader.read_next_message()
            except StopIteration:
                break
            yield message
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise WireError(400, "body", f"not an Arrow IPC stream: {exc}") from None
    if source.tell() != len(raw):
        raise WireError(400, "body", f"not an Arrow IPC stream: {len(raw) - source.tell()} bytes after its end")


def _schema(message: pa.ipc.Message | None) -> pa.Schema:
    if message is None or message.type != "schema":
        raise WireError(400, "body", "not an Arrow IPC stream: it does not start with a schema")
    try:
        schema = pa.ipc.read_schema(message)
        names = schema.names
    except (pa.ArrowException, OSError, ValueError) as exc:  # a name that is not UTF-8 too
        raise WireError(400, "body", f"not an Arrow IPC stream: {exc}") from None
    for name in names:
        if name not in ARRAY_COLUMNS:
            raise WireError(422, f"columns.{name}", "unknown column; the Arrow body's columns are "
                                                    + ", ".join(ARRAY_COLUMNS))
        if names.count(name) > 1:
            raise WireError(422, f"columns.{name}", "given twice")
        kind = schema.field(name).type
        item = kind.value_type if pa.types.is_list(kind) or pa.types.is_large_list(kind) else None
        fits = item is not None and (item in (pa.float32(), pa.float64()) if name in _FLOATS
                                     else pa.types.is_integer(item))
        if not fits:
            raise WireError(422, f"columns.{name}", f"{kind} is not accepted; expected a list of {_WHAT[name]}")
    return schema


def _trajectories(doc: Any) -> list[tuple[str, dict[str, Any]]] | None:
    """The document's trajectory objects in order with their fields' prefix (``groups[0].trajectories[3]``), or
    None when its shape is wrong (then validation names the field)."""
    batched = isinstance(doc, dict) and "groups" in doc
    groups = doc.get("groups") if batched else [doc]
    if not isinstance(groups, list):
        return None
    out: list[tuple[str, dict[str, Any]]] = []
    for i, g in enumerate(groups):
        members = g.get("trajectories") if isinstance(g, dict) else None
        if not isinstance(members, list) or not all(isinstance(t, dict) for t in members):
            return None
        where = f"groups[{i}]." if batched else ""
        for j, t in enumerate(members):
            for name in (*ARRAY_COLUMNS, "segments"):
                if t.get(name) is not None:  # null is as good as left out, as in a JSON body
                    message = ("a segmented trajectory is posted as JSON" if name == "segments"
                               else f"carried by the Arrow column {name!r}, not in the JSON")
                    raise WireError(422, f"{where}trajectories[{j}].{name}", message)
            out.append((f"{where}trajectories[{j}]", t))
    return out


def _columns(schema: pa.Schema, messages: Iterator[pa.ipc.Message], expected: int | None) -> dict[str, pa.Array]:
    batches: list[pa.RecordBatch] = []
    rows = 0
    for message in messages:
        if message.type != "record batch":
            raise WireError(422, "body", f"an Arrow {message.type} message is not accepted (no dictionary-encoded "
                                         "columns); send record batches only")
        if _compressed(message):
            raise WireError(422, "body", "compressed Arrow buffers are not accepted; send them uncompressed")
        try:
            batch = pa.ipc.read_record_batch(message, schema)
            batch.validate(full=True)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise WireError(400, "body", f"not a valid Arrow record batch: {exc}") from None
        if not batch.num_rows:
            raise WireError(422, "body", f"Arrow record batch {len(batches)} is empty; every batch holds a row at least")
        rows += batch.num_rows
        if expected is None or rows > expected:
            break
        batches.append(batch)
        if len(batches) > MAX_BATCHES:
            raise WireError(422, "body", f"more than {MAX_BATCHES} Arrow record batches; send the rows in fewer")
    if expected is not None and rows != expected:
        raise WireError(422, "body", f"{rows if rows <= expected else 'more'} Arrow rows for {expected} trajectories "
                                     "in the JSON; one row per trajectory, in order")
    if not batches:
        return {}
    try:
        return {name: pa.concat_arrays([b.column(name) for b in batches]) for name in schema.names}
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise WireError(400, "body", f"not a valid Arrow record batch: {exc}") from None


def _attach(trajectories: list[tuple[str, dict[str, Any]]], columns: dict[str, pa.Array]) -> None:
    for name, column in columns.items():
        offsets = column.offsets.to_numpy()
        values = column.values
        if values.null_count:  # only the values under non-null rows count (a null row's may be anything)
            for r, (where, _) in enumerate(trajectories):
                if column[r].is_valid and values.slice(offsets[r], offsets[r + 1] - offsets[r]).null_count:
                    raise WireError(422, f"{where}.{name}", "null items; a row is null (no array) or holds "
                                                           "numbers only")
            values = values.fill_null(0)  # those under null rows: to keep the values' own type
        flat = values.to_numpy(zero_copy_only=False)
        if name in _FLOATS:
            flat = flat.astype(np.float64)
        valid = column.is_valid().to_numpy(zero_copy_only=False)
        for r, (_, t) in enumerate(trajectories):
            if valid[r]:
                t[name] = flat[offsets[r] : offsets[r + 1]]


def _compressed(message: pa.ipc.Message) -> bool:
    """Whether a record batch message declares compressed buffers (its flatbuffer's RecordBatch.compression)."""
    meta = message.metadata.to_pybytes()
    try:
        header_type = _field(meta, _root(meta), _HEADER_TYPE, "<B")
        header = _table(meta, _root(meta), _HEADER)
        return header_type == _RECORD_BATCH and header is not None and _offset(meta, header, _COMPRESSION) is not None
    except struct.error:
        return True  # unreadable: refused as if compressed (pyarrow's verifier accepted it, so never here)


def _root(buf: bytes) -> int:
    return struct.unpack_from("<I", buf, 0)[0]


def _offset(buf: bytes, table: int, index: int) -> int | None:
    """Absolute position of field ``index`` of the table at ``table``, or None when absent."""
    vtable = table - struct.unpack_from("<i", buf, table)[0]
    if not 0 <= vtable < len(buf):
        raise struct.error("vtable out of range")
    size = struct.unpack_from("<H", buf, vtable)[0]
    entry = 4 + 2 * index
    if entry + 2 > size:
        return None
    at = struct.unpack_from("<H", buf, vtable + entry)[0]
    return table + at if at else None


def _field(buf: bytes, table: int, index: int, fmt: str) -> int | None:
    at = _offset(buf, table, index)
    return None if at is None else struct.unpack_from(fmt, buf, at)[0]


def _table(buf: bytes, table: int, index: int) -> int | None:
    at = _offset(buf, table, index)
    return None if at is None else at + struct.unpack_from("<I", buf, at)[0]
