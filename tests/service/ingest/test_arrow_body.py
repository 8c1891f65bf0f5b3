"""POST /v1/groups with an Arrow body (service.ingest.arrow_body, issue 27): the same request as the JSON body, its
token arrays as Arrow columns. It is validated by the same rules with the same field names, stores the same bytes,
hashes the same (a re-post in the other format is the same group), and hostile streams (compressed buffers,
offsets past their buffers, dictionaries, wrong types, rows that do not match the JSON) are refused naming the
field, with nothing stored."""

from __future__ import annotations

import copy
import random
import struct
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pytest
from sqlalchemy import func, select, text

from service.api.wire_checks import ARROW_MEDIA_TYPE
from service.ingest.arrow_body import BODY_KEY, encode_groups
from service.store.models import Group, Trajectory
from tests.helpers import make_group

ARROW = {"content-type": ARROW_MEDIA_TYPE}


def stored(session) -> tuple[int, int]:
    return (session.scalar(select(func.count()).select_from(Group)),
            session.scalar(select(func.count()).select_from(Trajectory)))


def sampler_group(group_id: str, *, n: int = 3, tokens: int = 600, seed: int = 0) -> dict[str, Any]:
    """A group as a sampler reports it: float32 log-probs written as doubles, a mask with more than 255 ones (a
    uint8 sum would wrap), token ids up to the int32 limit."""
    rng = random.Random(seed)
    group = make_group(group_id, prompt_id=f"p-{group_id}", n=n)
    for t in group["trajectories"]:
        t["token_ids"] = [rng.randrange(2**31) for _ in range(tokens - 1)] + [2**31 - 1]
        t["loss_mask"] = [0] * 40 + [1] * (tokens - 40)
        t["logprobs"] = [0.0] * 40 + [float(np.float32(-rng.expovariate(4.0))) for _ in range(tokens - 40)]
    return group


def test_an_arrow_post_stores_what_the_json_post_stores_and_is_the_same_group(client, session):
    body = {"groups": [sampler_group("a-0"), sampler_group("a-1", seed=1)]}
    r = client.post("/v1/groups", content=encode_groups(body), headers=ARROW)
    assert r.status_code == 201, r.text
    assert [a["created"] for a in r.json()["groups"]] == [True, True]
    twin = {"groups": [sampler_group("j-0"), sampler_group("j-1", seed=1)]}
    assert client.post("/v1/groups", json=twin).status_code == 201
    for arrow_id, json_id in (("a-0", "j-0"), ("a-1", "j-1")):
        a = client.get(f"/v1/groups/{arrow_id}", params={"include_tokens": True}).json()["trajectories"]
        j = client.get(f"/v1/groups/{json_id}", params={"include_tokens": True}).json()["trajectories"]
        assert [(t["token_ids"], t["loss_mask"], t["logprobs"], t["num_tokens"]) for t in a] == \
               [(t["token_ids"], t["loss_mask"], t["logprobs"], t["num_tokens"]) for t in j]
        assert a[0]["num_tokens"] == 560  # the ones of the mask, counted past 255
    # the same content in the other format is the same group (200), a changed log-prob is another body (409)
    again = client.post("/v1/groups", json=body)
    assert again.status_code == 200 and [x["created"] for x in again.json()["groups"]] == [False, False]
    assert client.post("/v1/groups", content=encode_groups(twin), headers=ARROW).status_code == 200
    changed = copy.deepcopy(body)
    changed["groups"][1]["trajectories"][2]["logprobs"][-1] = -0.5
    r = client.post("/v1/groups", content=encode_groups(changed), headers=ARROW)
    assert r.status_code == 409 and r.json()["error"].startswith("groups[1].id:"), r.text


def test_float64_log_probs_and_int64_token_ids_go_as_they_are(client, session):
    """A log-prob that is no float32 value travels as float64 (the hash sees the number the JSON would carry)."""
    group = make_group("f64")  # log-probs rounded to 4 decimals: not float32 values
    raw = encode_groups(group)
    schema = pa.ipc.open_stream(raw).schema
    assert schema.field("logprobs").type == pa.list_(pa.float64())
    assert client.post("/v1/groups", content=raw, headers=ARROW).status_code == 201
    assert client.post("/v1/groups", json=group).status_code == 200


@pytest.mark.parametrize(
    ("column", "position", "value", "message"),
    [
        ("token_ids", 3, -1, "greater than or equal to 0"),
        ("token_ids", 0, 2**31, "less than or equal to 2147483647"),
        ("token_ids", 9, 2**40, "less than or equal to 2147483647"),
        ("loss_mask", 5, 2, "less than or equal to 1"),
        ("loss_mask", 0, -1, "greater than or equal to 0"),
        ("logprobs", 7, float("nan"), "finite number"),
        ("logprobs", 0, float("inf"), "finite number"),
        ("logprobs", 8, float("-inf"), "finite number"),
        ("logprobs", 6, 0.01, "is not a log-probability"),
        ("logprobs", 9, -1e6, "is not a log-probability"),
    ],
)
def test_a_bad_value_is_refused_naming_its_position_as_the_json_body_would(client, session, column, position, value,
                                                                           message):
    body = {"groups": [make_group("ok", prompt_id="p-ok"), make_group("bad", prompt_id="p-bad")]}
    body["groups"][1]["trajectories"][2][column][position] = value
    r = client.post("/v1/groups", content=encode_groups(body), headers=ARROW)
    field = f"groups[1].trajectories[2].{column}[{position}]"
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["field"] == field and message in r.json()["detail"][0]["message"], r.text
    if not (isinstance(value, float) and not np.isfinite(value)):  # JSON has no NaN / inf to compare with
        assert client.post("/v1/groups", json=body).json()["detail"][0]["field"] == field
    assert stored(session) == (0, 0)


def test_lengths_rows_and_arrays_must_match_the_json(client, session):
    group = make_group("len")
    group["trajectories"][1]["loss_mask"] = group["trajectories"][1]["loss_mask"][:-1]
    r = client.post("/v1/groups", content=encode_groups(group), headers=ARROW)
    assert r.status_code == 422 and r.json()["error"].startswith("trajectories[1].loss_mask: length 9 differs"), r.text

    group = make_group("rows")
    raw = encode_groups({**group, "trajectories": group["trajectories"][:3]})
    doc = {k: v for k, v in group.items()}
    doc["trajectories"] = [{k: v for k, v in t.items() if k not in ("token_ids", "loss_mask", "logprobs")}
                           for t in group["trajectories"]]
    r = client.post("/v1/groups", content=with_body(raw, doc), headers=ARROW)  # 3 rows, 4 trajectories
    assert r.status_code == 422 and "3 Arrow rows for 4 trajectories" in r.json()["error"], r.text

    doc["trajectories"] = doc["trajectories"][:2]
    r = client.post("/v1/groups", content=with_body(raw, doc), headers=ARROW)  # 3 rows, 2 trajectories
    assert r.status_code == 422 and "more Arrow rows for 2 trajectories" in r.json()["error"], r.text

    inline = make_group("inline")
    raw = encode_groups(inline)
    doc = orjson.loads(pa.ipc.open_stream(raw).schema.metadata[BODY_KEY])
    doc["trajectories"][2]["token_ids"] = [1, 2]
    r = client.post("/v1/groups", content=with_body(raw, doc), headers=ARROW)
    assert r.status_code == 422 and r.json()["error"].startswith("trajectories[2].token_ids: carried by the Arrow"), r.text
    doc["trajectories"][2] = {**doc["trajectories"][2], "segments": []}
    doc["trajectories"][2].pop("token_ids")
    r = client.post("/v1/groups", content=with_body(raw, doc), headers=ARROW)
    assert r.status_code == 422 and r.json()["error"].startswith("trajectories[2].segments: a segmented"), r.text
    assert stored(session) == (0, 0)


def test_a_null_row_is_a_trajectory_without_that_array_and_a_null_item_is_refused(client, session):
    group = make_group("nulls")
    for t in group["trajectories"]:
        del t["logprobs"]
    del group["trajectories"][1]["token_ids"], group["trajectories"][1]["loss_mask"]
    assert client.post("/v1/groups", content=encode_groups(group), headers=ARROW).status_code == 201
    out = client.get("/v1/groups/nulls", params={"include_tokens": True}).json()["trajectories"]
    assert out[1]["token_ids"] is None and out[0]["token_ids"] == group["trajectories"][0]["token_ids"]
    assert all(t["logprobs"] is None for t in out)
    assert client.post("/v1/groups", json=group).status_code == 200

    group = make_group("holes")
    raw = encode_groups(group)
    table = pa.ipc.open_stream(raw).read_all()
    ids = [list(t["token_ids"]) for t in group["trajectories"]]
    ids[3][4] = None
    column = pa.array(ids, pa.list_(pa.int32()))
    r = client.post("/v1/groups", content=stream(table.schema, [table.set_column(0, "token_ids", column)]), headers=ARROW)
    assert r.status_code == 422 and r.json()["error"].startswith("trajectories[3].token_ids: null items"), r.text
    assert stored(session) == (1, 4)

    # null items under a null row are Arrow's business, not a reason to refuse the rows that hold numbers (attack)
    group = make_group("under-null", n=2)
    first = group["trajectories"][0]
    column = pa.ListArray.from_arrays(pa.array([0, 10, 20], pa.int32()),
                                      pa.array(first["token_ids"] + [None] * 10, pa.int32()), mask=pa.array([False, True]))
    del group["trajectories"][1]["token_ids"], group["trajectories"][1]["loss_mask"], group["trajectories"][1]["logprobs"]
    raw = encode_groups(group)
    table = pa.ipc.open_stream(raw).read_all()
    r = client.post("/v1/groups", content=stream(table.schema, [table.set_column(0, "token_ids", column)]), headers=ARROW)
    assert r.status_code == 201, r.text
    assert client.post("/v1/groups", json=group).status_code == 200

    # a JSON null array is as good as none, in either body
    group = make_group("json-null")
    doc = orjson.loads(pa.ipc.open_stream(encode_groups(group)).schema.metadata[BODY_KEY])
    doc["trajectories"][0].update(token_ids=None, versions=None, segments=None)
    assert client.post("/v1/groups", content=with_body(encode_groups(group), doc), headers=ARROW).status_code == 201
    assert client.post("/v1/groups", json=group).status_code == 200


def test_hostile_streams_are_refused_before_a_value_is_read(client, session):
    group = make_group("hostile")
    raw = encode_groups(group)
    table = pa.ipc.open_stream(raw).read_all()
    for codec in ("zstd", "lz4"):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression=codec)) as w:
            w.write_table(table)
        r = client.post("/v1/groups", content=sink.getvalue().to_pybytes(), headers=ARROW)
        assert r.status_code == 422 and "compressed Arrow buffers" in r.json()["error"], r.text

    # offsets patched in the stream's bytes: past the values buffer, and running backwards (a negative length)
    for patched in ([0, 10, 20, 1_000_000, 40], [0, 10, 20, 5, 40]):
        tampered = raw.replace(np.array([0, 10, 20, 30, 40], "<i4").tobytes(), np.array(patched, "<i4").tobytes(), 1)
        assert tampered != raw
        r = client.post("/v1/groups", content=tampered, headers=ARROW)
        assert r.status_code == 400 and r.json()["error"].startswith("body: not a valid Arrow record batch"), r.text

    # dictionary-encoded, unknown, repeated and mistyped columns
    strings = pa.schema([("token_ids", pa.list_(pa.string()))], metadata=table.schema.metadata)
    cases = [
        (pa.schema([("token_ids", pa.dictionary(pa.int8(), pa.int32()))], metadata=table.schema.metadata),
         "columns.token_ids: dictionary"),
        (pa.schema([("tokens", pa.list_(pa.int32()))], metadata=table.schema.metadata), "columns.tokens: unknown column"),
        (strings, "columns.token_ids: list<item: string> is not accepted"),
        (pa.schema([("logprobs", pa.list_(pa.float16()))], metadata=table.schema.metadata),
         "columns.logprobs: list<item: halffloat> is not accepted"),
        (pa.schema([("loss_mask", pa.list_(pa.bool_()))], metadata=table.schema.metadata),
         "columns.loss_mask: list<item: bool> is not accepted"),
        (pa.schema([("token_ids", pa.list_(pa.int32())), ("token_ids", pa.list_(pa.int32()))],
                   metadata=table.schema.metadata), "columns.token_ids: given twice"),
        (pa.schema([("token_ids", pa.list_(pa.int32()))]), "body: the Arrow schema's metadata has no"),
    ]
    for schema, error in cases:
        r = client.post("/v1/groups", content=stream(schema, []), headers=ARROW)
        assert r.status_code == 422 and r.json()["error"].startswith(error), (error, r.text)

    empty = table.to_batches()[0].slice(0, 0)  # empty batches cost a read each and carry nothing (attack: 340,000)
    r = client.post("/v1/groups", content=stream(table.schema, [table.slice(0, 2), empty, table.slice(2)]), headers=ARROW)
    assert r.status_code == 422 and r.json()["error"] == "body: Arrow record batch 1 is empty; every batch holds a " \
                                                        "row at least", r.text
    assert client.post("/v1/groups", content=stream(table.schema, [table.slice(0, 1), table.slice(1)]),
                       headers=ARROW).status_code == 201  # rows split over batches are one column
    assert client.get("/v1/groups/hostile", params={"include_tokens": True}).json()["trajectories"][3]["token_ids"] \
        == group["trajectories"][3]["token_ids"]
    session.execute(text("DELETE FROM trajectories; DELETE FROM groups"))

    for junk in (b"\x00" * 64, raw[: len(raw) // 2], b'{"id": "x"}', raw[:8], raw + b"{}",
                 raw.replace(b"token_ids", b"token_id\xff", 1)):  # bytes after its end; a name that is not UTF-8
        r = client.post("/v1/groups", content=junk, headers=ARROW)
        assert r.status_code == 400 and r.json()["error"].startswith("body: not an Arrow IPC stream"), r.text
    # the record batch's own flatbuffer tampered with (attack): its length, a buffer's offset past the body
    start, size = batch_metadata(raw)
    meta = raw[start : start + size]
    for old, new in ((struct.pack("<q", 4), struct.pack("<q", 5)), (struct.pack("<q", 160), struct.pack("<q", 10**9))):
        assert old in meta
        r = client.post("/v1/groups", content=raw[:start] + meta.replace(old, new, 1) + raw[start + size :],
                        headers=ARROW)
        assert r.status_code == 400 and r.json()["error"].startswith("body: not a valid Arrow record batch"), r.text
    assert stored(session) == (0, 0)


def test_the_json_part_passes_the_json_bodys_wire_checks(client, session):
    raw = encode_groups(make_group("wire"))
    schema = pa.ipc.open_stream(raw).schema
    text = schema.metadata[BODY_KEY]
    dup = text.replace(b'{"id":"wire"', b'{"id":"wire","id":"other"', 1)
    r = client.post("/v1/groups", content=with_body(raw, dup), headers=ARROW)
    assert r.status_code == 400 and "duplicate key" in r.json()["error"] and r.json()["error"].startswith("id"), r.text
    nul = text.replace(b'"wire"', b'"wi\\u0000re"', 1)
    r = client.post("/v1/groups", content=with_body(raw, nul), headers=ARROW)
    assert r.status_code == 422 and r.json()["error"].startswith("id:"), r.text
    deep = text[:-1] + b',"metadata":' + b"[" * 70 + b"]" * 70 + b"}"
    r = client.post("/v1/groups", content=with_body(raw, deep), headers=ARROW)
    assert r.status_code == 422 and r.json()["error"].startswith("metadata"), r.text
    assert stored(session) == (0, 0)


def test_the_container_limit_counts_the_json_part(session, db_url):
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    app = create_app(database_url=db_url, settings=Settings(database_url=db_url, max_body_containers=200))
    group = make_group("many", metadata={"k": [[0]] * 300})
    with TestClient(app) as c:
        r = c.post("/v1/groups", content=encode_groups(group), headers=ARROW)
    assert r.status_code == 413 and "max_body_containers" in r.json()["error"], r.text


def test_only_post_groups_takes_an_arrow_body(client):
    r = client.post("/v1/prompts", content=encode_groups(make_group("x")), headers=ARROW)
    assert r.status_code == 415 and r.json()["error"] == "content-type: expected application/json, got " \
                                                        "'application/vnd.apache.arrow.stream'", r.text
    r = client.post("/v1/groups", content=b"x", headers={"content-type": "application/x-msgpack"})
    assert r.status_code == 415 and "application/json or application/vnd.apache.arrow.stream" in r.json()["error"]


def test_the_encoder_sends_what_the_json_would_or_refuses_as_it_would(client, session):
    """The encoder never changes a value (attack: uint64 wrapped to -1, NaN in the JSON part became null, an empty
    array turned its column into doubles); what JSON cannot carry it refuses, naming the field."""
    group = make_group("enc", n=3)
    group["trajectories"][0].update(token_ids=[], loss_mask=[], logprobs=[])  # an empty array: the column's type
    assert client.post("/v1/groups", content=encode_groups(group), headers=ARROW).status_code == 201
    assert client.post("/v1/groups", json=group).status_code == 200

    wide = make_group("wide", n=2)
    wide["trajectories"][1]["token_ids"][5] = 2**64 - 1  # uint64: sent as it is, refused by the service's rule
    raw = encode_groups({"groups": [wide]})
    assert pa.ipc.open_stream(raw).schema.field("token_ids").type == pa.list_(pa.uint64())
    r = client.post("/v1/groups", content=raw, headers=ARROW)
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "groups[0].trajectories[1].token_ids[5]", r.text
    assert "less than or equal to 2147483647" in r.json()["detail"][0]["message"]
    assert client.post("/v1/groups", json={"groups": [wide]}).json()["detail"][0]["field"] == \
        "groups[0].trajectories[1].token_ids[5]"
    wide["trajectories"][0]["versions"] = [-1] * 10  # -1 in one trajectory, 2**63 in another: no 64-bit type
    wide["trajectories"][1]["versions"] = [2**63] * 10
    with pytest.raises(ValueError, match="versions: values from -1 to 9223372036854775808 fit no 64-bit integer"):
        encode_groups(wide)
    wide["trajectories"][0]["versions"] = [-1] * 9 + [2**64]  # in one list: no numpy integer holds them either
    with pytest.raises(ValueError, match=r"trajectories\[0\]\.versions: values from -1 to 18446744073709551616 fit no"):
        encode_groups(wide)

    for bad, match in (({"sampling": {"temperature": float("nan")}}, "Out of range float"),
                       ({"metadata": {"x": float("inf")}}, "Out of range float")):
        with pytest.raises(ValueError, match=match):
            encode_groups({**make_group("nan"), **bad})
    for column, value, kind in (("token_ids", None, "integers"), ("token_ids", True, "integers"),
                                ("token_ids", 1.5, "integers"), ("logprobs", None, "numbers"),
                                ("logprobs", "x", "numbers")):
        g = make_group("items", n=2)
        g["trajectories"][1][column][3] = value
        with pytest.raises(ValueError, match=rf"trajectories\[1\]\.{column}: not a list of {kind}"):
            encode_groups(g)
    seg = make_group("seg", n=1)
    seg["trajectories"][0]["segments"] = [{"token_ids": [1], "loss_mask": [1]}]
    with pytest.raises(ValueError, match=r"trajectories\[0\]\.segments: a segmented trajectory is posted as JSON"):
        encode_groups(seg)
    assert stored(session) == (1, 3)


def test_versions_go_by_the_same_rule_in_numpy(client, session):
    """The versions column is checked in numpy (attack: 60 M int8 versions were walked in Python before the length
    check) with the walk's errors; the group's staleness is the oldest generated token's either way."""
    group = make_group("ver", n=2, policy_version=5)
    for k, t in enumerate(group["trajectories"]):
        t["versions"] = [-1] * 4 + [3 + k] * 6
    assert client.post("/v1/groups", content=encode_groups(group), headers=ARROW).status_code == 201
    assert client.post("/v1/groups", json=group).status_code == 200
    assert session.scalar(select(Group.oldest_version).where(Group.id == "ver")) == 3
    for position, value, message in ((2, 0, "a token the model did not generate (loss_mask 0) has version -1, got 0"),
                                     (7, -1, "a generated token (loss_mask 1) carries the version that generated it"),
                                     (9, 6, "version 6 is newer than the policy_version 5")):
        bad = copy.deepcopy(group)
        bad["id"] = "ver-bad"
        bad["trajectories"][1]["versions"][position] = value
        r = client.post("/v1/groups", content=encode_groups(bad), headers=ARROW)
        assert r.status_code == 422 and r.json()["error"].startswith(f"trajectories[1].versions[{position}]: {message}"), r.text
        assert client.post("/v1/groups", json=bad).json()["error"] == r.json()["error"]
    huge = make_group("huge", n=1)
    raw = encode_groups(huge)
    table = pa.ipc.open_stream(raw).read_all()
    versions = pa.ListArray.from_arrays(pa.array([0, 5_000_000], pa.int32()), pa.array(np.zeros(5_000_000, np.int8)))
    r = client.post("/v1/groups", content=stream(table.schema.append(pa.field("versions", versions.type)),
                                                 [table.append_column("versions", versions)]), headers=ARROW)
    assert r.status_code == 422 and "versions: length 5000000 differs from token_ids length 10" in r.json()["error"]


def test_the_client_posts_arrow_over_http(live_server):
    from service.client import CuratorClient

    with CuratorClient(live_server.url) as c:
        ack = c.post_groups([sampler_group("c-0"), sampler_group("c-1", seed=3)], format="arrow")
        assert [a["created"] for a in ack["groups"]] == [True, True]
        assert c.post_group(sampler_group("c-1", seed=3))["created"] is False  # JSON: the same group
        got = c.get_group("c-0", include_tokens=True)["trajectories"][1]
        assert got["logprobs"] == sampler_group("c-0")["trajectories"][1]["logprobs"]
        with pytest.raises(ValueError, match="format: unknown 'msgpack'"):
            c.post_group(sampler_group("c-2"), format="msgpack")  # type: ignore[arg-type]


def batch_metadata(raw: bytes) -> tuple[int, int]:
    """(start, size) of the first record batch's flatbuffer in a stream written by ``encode_groups``."""
    after_schema = 8 + struct.unpack_from("<i", raw, 4)[0]
    return after_schema + 8, struct.unpack_from("<i", raw, after_schema + 4)[0]


def with_body(raw: bytes, doc: Any) -> bytes:
    """``raw``'s stream with another JSON part (``doc``: an object, or bytes as they are)."""
    table = pa.ipc.open_stream(raw).read_all()
    text = doc if isinstance(doc, bytes) else orjson.dumps(doc)
    return stream(table.schema.with_metadata({BODY_KEY: text}), [table.replace_schema_metadata({BODY_KEY: text})])


def stream(schema: pa.Schema, parts: list[pa.Table | pa.RecordBatch]) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for part in parts:
            writer.write_batch(part) if isinstance(part, pa.RecordBatch) else writer.write_table(part)
    return sink.getvalue().to_pybytes()
