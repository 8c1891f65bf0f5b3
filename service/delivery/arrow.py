"""Wire formats of a leased batch: Arrow IPC stream and its JSON twin, both built from the stored bytes.

A batch is held as columns, one entry per trajectory (groups in lease order, trajectories by index).
Arrow: one row per trajectory; ``token_ids`` list<int32>, ``loss_mask`` list<uint8>, ``logprobs``
list<float32> are built straight from the concatenated bytea values plus offsets (no per-token Python);
``batch_id``, ``trainer_id``, ``expires_at`` and ``stats`` travel in the schema metadata.
A segmented trajectory is still one row: its arrays hold the segments concatenated and
``segment_lengths`` / ``segment_advantages`` cut them apart; both decoded forms give it ``segments``
(``segment_index``, ``is_last``, the arrays, ``advantage``) and null top-level arrays, so a trajectory's
segments always travel together. Its ``segment_advantage`` (the group's curation policy's: broadcast,
divide, discount) tells the trainer how to weigh them (`filters.segments.segment_weight`).
JSON (orjson, numpy arrays serialised natively) carries the same numbers: log-probs, advantages and
rewards are float32 values written as the float64 that equals them, so both formats decode to
identical Python numbers. A missing array (the producer sent none) is null in both.
Each trajectory also carries its stored ``finish_reason`` and ``rewards``: {component: value} of the spec
version that scored its group (an errored component's value is null; null when no component is stored),
an Arrow map<string, float32>; decoded, both give the same dict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from service.store.arrays import LOGPROB_DTYPE, MASK_DTYPE, TOKEN_DTYPE, VERSION_DTYPE

ARROW_SCHEMA = pa.schema(
    [
        ("group_id", pa.string()),
        ("prompt_id", pa.string()),
        ("policy_version", pa.int64()),
        ("index", pa.int32()),
        ("token_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.uint8())),
        ("logprobs", pa.list_(pa.float32())),
        ("versions", pa.list_(pa.int32())),  # per-token policy versions (-1: not generated); null: not given
        ("advantage", pa.float32()),
        ("total_reward", pa.float32()),
        ("temperature", pa.float64()),  # the group's sampling.temperature (null when it did not say)
        ("finish_reason", pa.string()),  # the stored finish_reason ('stop', 'length', ...)
        # {component: value} of the spec version that scored the group (null value: errored; null: none stored)
        ("rewards", pa.map_(pa.string(), pa.float32())),
        # a segmented trajectory: its arrays are the segments concatenated; these cut them apart (null: not)
        ("segment_lengths", pa.list_(pa.int32())),
        ("segment_advantages", pa.list_(pa.float32())),
        ("segment_advantage", pa.string()),  # the curation policy's mode: the trainer's segment weight
    ]
)
_ARRAYS = (
    ("token_ids", TOKEN_DTYPE), ("loss_mask", MASK_DTYPE), ("logprobs", LOGPROB_DTYPE), ("versions", VERSION_DTYPE)
)


@dataclass(frozen=True)
class BatchColumns:
    """A leased batch: header fields plus per-trajectory columns, each of length N (trajectories)."""

    batch_id: str
    trainer_id: str
    expires_at: str
    stats: dict[str, Any]
    group_id: list[str]
    prompt_id: list[str]
    policy_version: list[int]
    index: list[int]
    token_ids: list[bytes | None]
    loss_mask: list[bytes | None]
    logprobs: list[bytes | None]
    advantage: list[float | None]
    total_reward: list[float | None]
    temperature: list[float | None]
    finish_reason: list[str | None]
    rewards: list[dict[str, float | None] | None]
    segment_lengths: list[list[int] | None] | None = None  # None: no trajectory of the batch is segmented
    segment_advantages: list[list[float] | None] | None = None
    segment_advantage: list[str | None] | None = None  # each segmented trajectory's policy mode

    def seg(self, i: int) -> tuple[list[int] | None, list[float] | None, str | None]:
        """Trajectory i's segment lengths, advantages and mode (None, None, None: not segmented)."""
        if self.segment_lengths is None:
            return None, None, None
        advs = self.segment_advantages[i] if self.segment_advantages is not None else None
        mode = self.segment_advantage[i] if self.segment_advantage is not None else None
        return self.segment_lengths[i], advs, mode
    versions: list[bytes | None] = field(default_factory=list)  # empty: none of them given

    def header(self) -> dict[str, Any]:
        return {"batch_id": self.batch_id, "trainer_id": self.trainer_id, "expires_at": self.expires_at}


def _f32(value: float | None) -> float | None:
    """A stored float64 rounded to the float32 both formats carry."""
    return None if value is None else float(np.float32(value))


def _array(raw: bytes | None, dtype: np.dtype) -> np.ndarray | None:
    """bytea (T * itemsize,) -> array (T,); float32 widened to the float64 that equals it (exact JSON)."""
    if raw is None:
        return None
    arr = np.frombuffer(raw, dtype=dtype)
    return (
        arr.astype(np.float64)
        if arr.dtype.kind == "f"
        else arr.astype(arr.dtype.newbyteorder("="), copy=False)
    )


def _column(batch: BatchColumns, name: str) -> list[Any]:
    """A per-trajectory column; ``versions`` left empty means null for every trajectory."""
    values = getattr(batch, name)
    return values if values or name != "versions" else [None] * len(batch.index)


def encode_json(batch: BatchColumns) -> bytes:
    """BatchColumns -> ``{"batch_id", "trainer_id", "expires_at", "groups": [...], "stats"}`` as bytes."""
    groups: list[dict[str, Any]] = []
    for i, gid in enumerate(batch.group_id):
        if not groups or groups[-1]["id"] != gid:
            groups.append(
                {
                    "id": gid,
                    "prompt_id": batch.prompt_id[i],
                    "policy_version": batch.policy_version[i],
                    "temperature": batch.temperature[i],
                    "trajectories": [],
                }
            )
        traj: dict[str, Any] = {"index": batch.index[i]}
        for name, dtype in _ARRAYS:
            traj[name] = _array(_column(batch, name)[i], dtype)
        traj["advantage"] = _f32(batch.advantage[i])
        traj["total_reward"] = _f32(batch.total_reward[i])
        traj["finish_reason"] = batch.finish_reason[i]
        traj["rewards"] = _rewards(batch.rewards[i])
        lengths, advs, mode = batch.seg(i)
        if lengths is not None:
            shares: list[float | None] = [_f32(a) for a in advs] if advs else [None] * len(lengths)
            _segment(traj, lengths, shares, mode)
        groups[-1]["trajectories"].append(traj)
    body = {**batch.header(), "groups": groups, "stats": batch.stats}
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def _rewards(values: dict[str, float | None] | None) -> dict[str, float | None] | None:
    """Stored component values -> the float32 both formats carry, components in name order."""
    return None if values is None else {name: _f32(values[name]) for name in sorted(values)}


def _segment(traj: dict[str, Any], lengths: list[int], advs: list[float | None], mode: str | None) -> None:
    """A trajectory dict with concatenated arrays -> its ``segments`` (in order, each with
    ``segment_index``, ``is_last``, its arrays and ``advantage``) and ``segment_advantage`` (``mode``); the
    top-level arrays become null."""
    segments, start = [], 0
    for k, n in enumerate(lengths):
        seg: dict[str, Any] = {"segment_index": k, "is_last": k == len(lengths) - 1}
        for name, _ in _ARRAYS:
            arr = traj[name]
            seg[name] = None if arr is None else arr[start : start + n]
        seg["advantage"] = advs[k]
        segments.append(seg)
        start += n
    for name, _ in _ARRAYS:
        traj[name] = None
    traj["segments"] = segments
    traj["segment_advantage"] = mode


def _list_column(chunks: list[bytes | None], dtype: np.dtype, value_type: pa.DataType) -> pa.ListArray:
    """N byte strings -> list array (N,) from offsets (N+1,) and the concatenated values; None -> null."""
    lengths = np.fromiter(
        (0 if c is None else len(c) // dtype.itemsize for c in chunks), np.int64, len(chunks)
    )
    offsets = np.zeros(len(chunks) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.frombuffer(b"".join(c for c in chunks if c is not None), dtype=dtype)
    values = values.astype(dtype.newbyteorder("="), copy=False)
    nulls = [c is None for c in chunks]
    mask = pa.array(nulls, type=pa.bool_()) if any(nulls) else None
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=value_type), mask=mask)


def warm_up() -> None:
    """Build one Arrow array. pyarrow's first array imports pandas where it is installed (~1 s of CPU): a
    served app does this once at start (``service.app``), so that no trainer's first Arrow lease from a
    server process pays it."""
    pa.array([], type=pa.int64())


def encode_arrow(batch: BatchColumns) -> bytes:
    """BatchColumns -> one Arrow IPC stream holding one record batch (N rows), metadata in the schema."""
    metadata = {**batch.header(), "stats": orjson.dumps(batch.stats).decode()}
    schema = ARROW_SCHEMA.with_metadata(metadata)
    columns = [
        pa.array(batch.group_id, type=pa.string()),
        pa.array(batch.prompt_id, type=pa.string()),
        pa.array(batch.policy_version, type=pa.int64()),
        pa.array(batch.index, type=pa.int32()),
        *(
            _list_column(_column(batch, name), dtype, schema.field(name).type.value_type)
            for name, dtype in _ARRAYS
        ),
        pa.array([_f32(v) for v in batch.advantage], type=pa.float32()),
        pa.array([_f32(v) for v in batch.total_reward], type=pa.float32()),
        pa.array(batch.temperature, type=pa.float64()),
        pa.array(batch.finish_reason, type=pa.string()),
        pa.array([None if (r := _rewards(v)) is None else list(r.items()) for v in batch.rewards],
                 type=schema.field("rewards").type),
        pa.array([batch.seg(i)[0] for i in range(len(batch.index))], type=pa.list_(pa.int32())),
        pa.array([None if (a := batch.seg(i)[1]) is None else [_f32(v) for v in a]
                  for i in range(len(batch.index))], type=pa.list_(pa.float32())),
        pa.array([batch.seg(i)[2] for i in range(len(batch.index))], type=pa.string()),
    ]
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_batch(pa.record_batch(columns, schema=schema))
    return sink.getvalue().to_pybytes()


def _split(column: pa.ListArray, as_numpy: bool) -> list[Any]:
    """list array (N,) -> N python lists (or read-only numpy views); nulls -> None."""
    values = column.values.to_numpy(zero_copy_only=False)
    offsets = column.offsets.to_numpy()
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    rows: list[Any] = []
    for i in range(len(column)):
        if not valid[i]:
            rows.append(None)
            continue
        part = values[offsets[i] : offsets[i + 1]]
        rows.append(part if as_numpy else part.tolist())
    return rows


def _rows(record: pa.RecordBatch, as_numpy: bool) -> list[tuple[tuple[str, str, int, float | None], dict[str, Any]]]:
    """One record batch -> [((group_id, prompt_id, policy_version, temperature), trajectory dict)] in row order."""
    cols = {name: record.column(name) for name in record.schema.names}
    keys = ("group_id", "prompt_id", "policy_version", "temperature", "index")
    plain = {name: cols[name].to_pylist() for name in keys}
    lists = {name: _split(cols[name], as_numpy) for name, _ in _ARRAYS}
    scalars = {name: cols[name].to_pylist() for name in ("advantage", "total_reward", "finish_reason")}
    rewards = [None if r is None else dict(r) for r in cols["rewards"].to_pylist()] if "rewards" in cols else None
    none: list[Any] = [None] * record.num_rows
    seg_lengths = cols["segment_lengths"].to_pylist() if "segment_lengths" in cols else none
    seg_advs = cols["segment_advantages"].to_pylist() if "segment_advantages" in cols else none
    seg_modes = cols["segment_advantage"].to_pylist() if "segment_advantage" in cols else none  # older: guessed
    out = []
    for i in range(record.num_rows):
        key = (plain["group_id"][i], plain["prompt_id"][i], plain["policy_version"][i], plain["temperature"][i])
        traj = {"index": plain["index"][i], **{k: v[i] for k, v in lists.items()}}
        traj.update({k: v[i] for k, v in scalars.items()})
        traj["rewards"] = None if rewards is None else rewards[i]
        lengths: list[int] | None = seg_lengths[i]
        if lengths is not None:
            _segment(traj, lengths, seg_advs[i] or [None] * len(lengths), seg_modes[i])
        out.append((key, traj))
    return out


def decode_arrow(data: bytes, *, as_numpy: bool = False) -> dict[str, Any]:
    """Arrow IPC stream -> the JSON answer's shape: ``{"batch_id", "trainer_id", "expires_at", "groups", "stats"}``.

    ``as_numpy=True`` gives read-only numpy views (token_ids int32, loss_mask uint8, logprobs float32)
    instead of lists: no copy, for trainers that go straight to tensors.
    """
    reader = pa.ipc.open_stream(data)
    meta = {k.decode(): v.decode() for k, v in (reader.schema.metadata or {}).items()}
    groups: list[dict[str, Any]] = []
    for record in reader:
        for (gid, pid, version, temperature), traj in _rows(record, as_numpy):
            if not groups or groups[-1]["id"] != gid:
                group = {"id": gid, "prompt_id": pid, "policy_version": version, "temperature": temperature}
                groups.append({**group, "trajectories": []})
            groups[-1]["trajectories"].append(traj)
    header = {k: meta[k] for k in ("batch_id", "trainer_id", "expires_at")}
    return {**header, "groups": groups, "stats": orjson.loads(meta.get("stats", "{}"))}
