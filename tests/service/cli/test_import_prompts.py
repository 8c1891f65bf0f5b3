"""grpo-curator import prompts: a verl-shaped Parquet file and a JSONL file, through the real app."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import func, select

from service.cli import import_prompts as import_cli
from service.store.models import Prompt


def verl_row(i: int, source: str = "openai/gsm8k", truth: object = "42", **over) -> dict:
    row = {"data_source": source, "prompt": [{"role": "user", "content": f"question {i}"}], "ability": "math",
           "reward_model": {"style": "rule", "ground_truth": truth}, "extra_info": {"split": "train", "index": i}}
    row.update(over)
    return row


def write_verl(path: Path, rows: list[dict]) -> None:
    schema = pa.schema([
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        ("extra_info", pa.struct([("split", pa.string()), ("index", pa.int64())])),
    ])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, row_group_size=2)


class _Borrowed:
    def __init__(self, client) -> None:
        self.client = client

    def __enter__(self):
        return self.client

    def __exit__(self, *exc: object) -> None:
        pass


@pytest.fixture
def run(client, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture):
    monkeypatch.setattr(import_cli, "http_client", lambda url, key: _Borrowed(client))

    def run(*argv: str) -> tuple[int, dict]:
        code = import_cli.main(list(argv))
        out = capsys.readouterr().out
        return code, json.loads(out) if out.strip().startswith("{") else {}

    return run


def test_verl_parquet(run, session, tmp_path: Path) -> None:
    path = tmp_path / "train.parquet"
    rows = [verl_row(0), verl_row(1, truth="7"), verl_row(2, source="math"),
            verl_row(3, reward_model=None),                                       # no ground truth
            verl_row(4, prompt=[{"role": "robot", "content": "x"}]),              # not a chat message
            verl_row(5, source=None),                                             # no data_source
            verl_row(0)]                                                          # the same row again
    write_verl(path, rows)
    code, summary = run("prompts", str(path), "--format", "verl")
    assert code == 0
    assert (summary["taken"], summary["rejected"]) == (4, 3)
    assert summary["reasons"] == {"reward_model.ground_truth": 1, "messages[0].role": 1, "dataset": 1}
    assert summary["examples"][0].startswith("row 3: reward_model.ground_truth")
    stored = {p.messages[0]["content"]: p for p in session.scalars(select(Prompt)).all()}
    assert sorted(stored) == ["question 0", "question 1", "question 2"]
    q1 = stored["question 1"]
    assert (q1.dataset, q1.reference, q1.metadata_) == (
        "openai/gsm8k", {"answer": "7"}, {"split": "train", "index": 1, "ability": "math"})
    assert stored["question 2"].dataset == "math"
    before = {p.id: p.updated_at for p in stored.values()}
    assert run("prompts", str(path), "--format", "verl")[1]["taken"] == 4  # again: idempotent
    session.expire_all()
    after = {p.id: p.updated_at for p in session.scalars(select(Prompt)).all()}
    assert after == before


def test_jsonl(run, session, tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    good = {"id": "a-1", "dataset": "toy", "messages": [{"role": "user", "content": "hi"}], "reference": {"answer": "1"}}
    lines = [json.dumps(good), "{not json", json.dumps({"dataset": "toy"}), "",
             json.dumps({**good, "id": "a-2", "reference": {"answer": float("nan")}}).replace("NaN", "1e999"),
             json.dumps({**good, "id": "a\x073"})]
    path.write_text("\n".join(lines) + "\n")
    code, summary = run("prompts", str(path), "--format", "jsonl")
    assert code == 0 and summary["taken"] == 1 and summary["rejected"] == 4
    assert summary["reasons"] == {"line": 2, "id": 2}  # NaN / 1e999 are not JSON: the line is rejected
    assert session.scalar(select(func.count()).select_from(Prompt)) == 1


def test_nothing_taken_and_missing_file(run, tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"dataset": "x"}\n')
    assert run("prompts", str(path), "--format", "jsonl")[0] == 2
    assert run("prompts", str(tmp_path / "none.parquet"), "--format", "verl")[0] == 1


# --- 7. import: a verl row whose ground truth is null -----------------------------------------------------
# Attack: a verl row with a null ground truth was imported with reference {answer: None}.

def test_import_verl_row_with_null_ground_truth_is_rejected(client, session, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from sqlalchemy import select

    from service.cli import import_prompts as import_cli
    from service.store.models import Prompt

    class Borrowed:
        def __enter__(self):
            return client

        def __exit__(self, *exc: object) -> None:
            pass

    monkeypatch.setattr(import_cli, "http_client", lambda url, key: Borrowed())
    schema = pa.schema([
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
    ])
    rows = [{"data_source": "gsm8k", "prompt": [{"role": "user", "content": "q-missing"}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": None}},   # a null cell: the label is missing
            {"data_source": "gsm8k", "prompt": [{"role": "user", "content": "q-ok"}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": "7"}}]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    assert import_cli.main(["prompts", str(path), "--format", "verl"]) == 0
    summary = json.loads(capsys.readouterr().out)
    stored = {p.messages[0]["content"]: p.reference for p in session.scalars(select(Prompt)).all()}
    # today: taken=2 and the prompt is stored with reference {"answer": None}; a row with reward_model=None
    # is rejected as "reward_model.ground_truth: missing", a null ground truth should be too
    assert (summary["taken"], summary["rejected"]) == (1, 1), summary
    assert summary["reasons"] == {"reward_model.ground_truth": 1}
    assert "q-missing" not in stored, stored
