"""Exports as trainers read them: tool-call arguments as objects through a real chat template, rollouts with
token ids / log-probs / loss masks as Parquet lists (pyarrow, polars), the verl RL layout, and verl code
ground truth imported into ``reference.tests`` / ``reference.io``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient

from reward_models.scoring import Scorer
from service.cli.import_prompts import code_reference, verl_prompt
from service.export.formats import arguments
from service.store.db import get_engine, make_sessionmaker
from service.worker.pipeline import drain
from tests.helpers import make_group, tool_episode

SPEC = {"name": "fmt-only", "components": [
    {"name": "fmt", "kind": "rule.format", "outcome": True, "params": {"required_tags": ["answer"]}}]}
TOOLS = [{"type": "function", "function": {"name": "calc", "parameters": {
    "type": "object", "properties": {"expr": {"type": "string"}, "digits": {"type": "integer"}}}}}]
TESTS = "assert add(1, 2) == 3\n"
IO = [{"input": "1 2\n", "output": "3\n"}, {"input": "5 5\n", "output": "10\n"}]


def _answer(text: str) -> dict:
    return {"messages": [{"role": "assistant", "content": text}], "finish_reason": "stop", "num_tokens": 3}


def _tool_group() -> dict:
    episode = tool_episode()
    episode["messages"][0]["tool_calls"] = [
        {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "6*7", "digits": 2}'}},
        {"id": "c2", "type": "function", "function": {"name": "calc", "arguments": "{oops"}},  # the model's mistake
    ]
    episode["messages"].insert(2, {"role": "tool", "content": "error", "tool_call_id": "c2"})
    episode["messages"][-1]["content"] = "<answer>42</answer>"
    g = make_group("t-tools", prompt_id="q-tools", trajectories=[episode, _answer("no tag")])
    g["prompt"]["metadata"] = {"tools": TOOLS}
    return g


def _groups() -> list[dict]:
    return [
        _tool_group(),
        make_group("t-math", prompt_id="q-math", dataset="gsm8k", reference={"answer": "42"},
                   trajectories=[_answer("<answer>42</answer>"), _answer("x")]),
        make_group("t-math-again", prompt_id="q-math", dataset="gsm8k", reference={"answer": "42"},
                   trajectories=[_answer("<answer>1</answer>"), _answer("y")]),  # same prompt: one verl row
        make_group("t-tests", prompt_id="q-tests", dataset="code", reference={"tests": TESTS},
                   trajectories=[_answer("<answer>def add(a, b): return a + b</answer>"), _answer("z")]),
        make_group("t-io", prompt_id="q-io", dataset="code", reference={"io": IO},
                   trajectories=[_answer("<answer>print(3)</answer>"), _answer("w")]),
    ]


@pytest.fixture(scope="module")
def store(make_db) -> Iterator[TestClient]:
    from service.app import create_app

    url = make_db()
    with TestClient(create_app(database_url=url)) as client:
        assert client.post("/v1/reward-specs", json=SPEC).status_code == 201
        for ds in ("toy", "gsm8k", "code"):
            assert client.put(f"/v1/datasets/{ds}", json={"reward_spec": "fmt-only"}).status_code == 200
        assert client.post("/v1/groups", json={"groups": _groups()}).status_code == 201
        with Scorer(processes=1, timeout_s=10) as scorer:
            drain(make_sessionmaker(get_engine(url)), scorer, timeout_s=120)
        yield client


def _get(client: TestClient, tmp_path: Path, filetype: str, **params) -> Path:
    r = client.get("/v1/export", params={**params, "filetype": filetype})
    assert r.status_code == 200, r.text
    path = tmp_path / f"{params['format']}-{params.get('tool_arguments', 'default')}.{filetype}"
    path.write_bytes(r.content)
    return path


def _load(path: Path, tmp_path: Path) -> list[dict]:
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_bytes().splitlines()]
    from datasets import load_dataset

    return [dict(r) for r in load_dataset("parquet", data_files=str(path), split="train", cache_dir=str(tmp_path / "c"))]


# --- tool-call arguments through a real chat template -------------------------------------------------------

# iterates the arguments' items, as Qwen's tool templates do, and writes them with tojson, as qwen2_5 / llama3_1
TEMPLATE = (
    "{%- for m in messages -%}"
    "<|{{ m.role }}|>{{ m.content if m.content is string else '' }}"
    "{%- if m.tool_calls -%}{%- for tc in m.tool_calls -%}"
    "{%- set f = tc.function if tc.function is defined else tc -%}"
    "<tool_call>{\"name\": \"{{ f.name }}\", \"arguments\": {{ f.arguments | tojson }}}"
    "{%- if f.arguments is mapping -%}[{%- for k, v in f.arguments | items -%}{{ k }}={{ v | tojson }};{%- endfor -%}]"
    "{%- endif -%}</tool_call>"
    "{%- endfor -%}{%- endif -%}\n"
    "{%- endfor -%}"
)


def _tokenizer():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"<unk>": 0}, unk_token="<unk>")),
                                   unk_token="<unk>")


@pytest.mark.parametrize("filetype", ["parquet", "jsonl"])
def test_tool_call_arguments_render_as_objects_through_a_chat_template(store, tmp_path, filetype):
    rows = _load(_get(store, tmp_path, filetype, format="sft", dataset="toy"), tmp_path)
    assert len(rows) == 1
    messages = rows[0]["messages"]
    calls = messages[1]["tool_calls"]
    assert calls[0]["function"]["arguments"] == {"expr": "6*7", "digits": 2}
    assert calls[1]["function"]["arguments"] == "{oops"  # not JSON: the text the model wrote, never dropped
    rendered = _tokenizer().apply_chat_template(messages, chat_template=TEMPLATE, tokenize=False)
    assert '"arguments": {"expr": "6*7", "digits": 2}' in rendered
    assert '[expr="6*7";digits=2;]' in rendered  # the template iterated the arguments' items
    assert '"arguments": "{\\"expr\\"' not in rendered  # not a quoted JSON string
    assert '"arguments": "{oops"' in rendered


def test_string_arguments_are_what_the_templates_get_wrong(store, tmp_path):
    """tool_arguments=string keeps the stored JSON text; the same template then writes a quoted string."""
    rows = _load(_get(store, tmp_path, "parquet", format="sft", dataset="toy", tool_arguments="string"), tmp_path)
    assert rows[0]["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"expr": "6*7", "digits": 2}'
    rendered = _tokenizer().apply_chat_template(rows[0]["messages"], chat_template=TEMPLATE, tokenize=False)
    assert '"arguments": "{\\"expr\\": \\"6*7\\", \\"digits\\": 2}"' in rendered


def test_argument_edges():
    assert arguments('{"a": [1, {"b": null}]}', True) == {"a": [1, {"b": None}]}
    assert arguments({"a": 1}, True) == {"a": 1}  # stored as an object already
    assert arguments({"a": 1}, False) == '{"a":1}'
    for text in ("[1, 2]", '"text"', "3", "", "{oops", "NaN", '{"a": NaN}', "[" * 5000 + "]" * 5000):
        assert arguments(text, True) == text  # not a JSON object: the text as it is
    huge = '{"n": ' + "9" * 30 + "}"
    assert arguments(huge, True) == huge  # no 64-bit integer: orjson could not write it again
    deep = '{"a": ' * 150 + "1" + "}" * 150
    assert arguments(deep, True) == deep


# --- rollouts: token arrays as Parquet lists ----------------------------------------------------------------

def test_rollouts_token_arrays_are_parquet_lists(store, tmp_path):
    path = _get(store, tmp_path, "parquet", format="rollouts", dataset="toy")
    schema = pq.read_schema(path)
    assert schema.field("token_ids").type == pa.list_(pa.int32())
    assert schema.field("logprobs").type == pa.list_(pa.float32())
    assert schema.field("loss_mask").type == pa.list_(pa.uint8())
    assert schema.field("advantage").type == pa.float64()
    import polars as pl

    frame = pl.read_parquet(path).sort("index")
    episode = tool_episode()
    assert frame["token_ids"].to_list() == [episode["token_ids"], None]
    assert frame["loss_mask"].to_list() == [episode["loss_mask"], None]
    assert frame["logprobs"].to_list() == [episode["logprobs"], None]
    assert frame["token_ids"].dtype == pl.List(pl.Int32)
    jsonl = _load(_get(store, tmp_path, "jsonl", format="rollouts", dataset="toy"), tmp_path)
    assert [r["token_ids"] for r in sorted(jsonl, key=lambda r: r["index"])] == [episode["token_ids"], None]


# --- the verl RL layout -------------------------------------------------------------------------------------

# the columns verl's RLHFDataset and reward loop read (its data preprocessing scripts write these)
VERL_COLUMNS = ["data_source", "prompt", "ability", "reward_model", "extra_info"]


@pytest.mark.parametrize("filetype", ["parquet", "jsonl"])
def test_verl_export_layout(store, tmp_path, filetype):
    path = _get(store, tmp_path, filetype, format="verl")
    rows = _load(path, tmp_path)
    if filetype == "parquet":
        assert pq.read_schema(path).names == VERL_COLUMNS
    by_id = {r["extra_info"]["prompt_id"]: r for r in rows}
    assert sorted(by_id) == ["q-io", "q-math", "q-tests", "q-tools"]  # q-math once, though two groups used it
    assert sorted(r["extra_info"]["index"] for r in rows) == [0, 1, 2, 3]
    math = by_id["q-math"]
    assert math["data_source"] == "gsm8k" and math["ability"] == "math"
    assert math["prompt"] == [{"role": "user", "content": "What is 6 * 7?"}]
    assert math["reward_model"] == {"style": "rule", "ground_truth": "42"}
    assert by_id["q-tests"]["ability"] == "code" and by_id["q-tests"]["reward_model"]["ground_truth"] == TESTS
    assert json.loads(by_id["q-io"]["reward_model"]["ground_truth"]) == {
        "inputs": ["1 2\n", "5 5\n"], "outputs": ["3\n", "10\n"]}
    assert all(r["extra_info"]["split"] == "train" for r in rows)


def test_verl_export_reimports_to_the_same_references(store, tmp_path):
    """A verl export read back by `grpo-curator import --format verl`: math to answer, code to tests / io."""
    rows = pq.read_table(_get(store, tmp_path, "parquet", format="verl")).to_pylist()
    refs = {r["extra_info"]["prompt_id"]: verl_prompt(r)["reference"] for r in rows}
    assert refs["q-math"] == {"answer": "42"}
    assert refs["q-tests"] == {"tests": TESTS}
    assert refs["q-io"] == {"io": IO}


def test_verl_with_min_reward_is_a_422(store):
    r = store.get("/v1/export", params={"format": "verl", "min_reward": 1})
    assert r.status_code == 422 and "min_reward" in r.json()["error"]
    r = store.get("/v1/export", params={"format": "sft", "tool_arguments": "yaml"})
    assert r.status_code == 422 and "tool_arguments" in r.json()["error"]


# --- import: a verl code row's ground truth -----------------------------------------------------------------

def _row(truth, ability="code"):
    return {"data_source": "apps", "prompt": [{"role": "user", "content": "add"}], "ability": ability,
            "reward_model": {"style": "rule", "ground_truth": truth}, "extra_info": {"index": 0}}


@pytest.mark.parametrize(("truth", "reference"), [
    (json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]}), {"io": [{"input": "1 2\n", "output": "3\n"}]}),
    (json.dumps(["assert f(1) == 2", "assert f(2) == 3"]), {"tests": "assert f(1) == 2\nassert f(2) == 3\n"}),
    (json.dumps("assert f(1) == 2"), {"tests": "assert f(1) == 2"}),
    ("assert f(1) == 2\n", {"tests": "assert f(1) == 2\n"}),  # not JSON: Python source
    ("1", {"tests": "1"}),  # a JSON scalar: the text, as source
])
def test_code_ground_truth_goes_to_tests_or_io(truth, reference):
    prompt = verl_prompt(_row(truth))
    assert prompt["reference"] == reference and "answer" not in prompt["reference"]
    assert prompt["metadata"]["ability"] == "code"


@pytest.mark.parametrize("truth", [
    json.dumps({"inputs": ["1"], "outputs": ["1"], "fn_name": "f"}),
    json.dumps({"inputs": ["1"], "outputs": []}),
    json.dumps({"inputs": [1], "outputs": [1]}),
    json.dumps({"inputs": [], "outputs": []}),
    json.dumps({"tests": 1}),
    json.dumps([1, 2]),
    json.dumps([]),
])
def test_bad_code_ground_truth_names_the_field(truth):
    with pytest.raises(ValueError, match=r"reward_model\.ground_truth"):
        code_reference(truth)


def test_math_rows_keep_answer():
    assert verl_prompt(_row('{"inputs": ["1"], "outputs": ["1"]}', ability="math"))["reference"] == {
        "answer": '{"inputs": ["1"], "outputs": ["1"]}'}


# --- arguments that cannot round-trip stay text; segments follow the options -----------------------------------

@pytest.mark.parametrize(
    "text",
    [
        '{"n": 1e999}',  # a float: inf, no JSON
        '{"n": -1e999}',
        '{"n": 2.5e-400}',  # underflows to 0.0
        '{"n": 0.1000000000000000000001}',  # more digits than a double keeps: 0.1
        '{"n": 12345678901234567890.5}',
        '{"a": 1, "a": 2}',  # duplicate key: which one the tool saw is the parser's choice
        '{"o": {"k": 1, "k": 1}}',
        '{"n": Infinity}',
    ],
)
def test_arguments_that_would_not_read_back_exactly_stay_text(text):
    assert arguments(text, True) == text
    assert arguments(text, False) == text


@pytest.mark.parametrize(
    ("text", "value"),
    [('{"n": 1.5, "m": -0.25, "e": 1e5}', {"n": 1.5, "m": -0.25, "e": 100000.0}),
     ('{"small": 5e-324, "pi": 3.141592653589793}', {"small": 5e-324, "pi": 3.141592653589793}),
     ('{"a": {"a": 1}, "b": [{"a": 2}, {"a": 3}]}', {"a": {"a": 1}, "b": [{"a": 2}, {"a": 3}]})],
)
def test_arguments_that_read_back_exactly_are_objects(text, value):
    parsed = arguments(text, True)
    assert parsed == value
    assert json.loads(json.dumps(parsed)) == json.loads(text)  # written again, the same object


def _segmented_row() -> dict:
    call = {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "6*7"}'}}
    turn = [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "content": "42",
                                                                           "tool_call_id": "c1"}]
    return {"group_id": "g", "idx": 0, "prompt_id": "p", "dataset": "toy", "policy_version": 0,
            "group_status": "ready", "reward_spec_name": None, "reward_spec_version": None,
            "prompt_messages": [{"role": "user", "content": "q"}], "messages": turn, "final_answer": "42",
            "finish_reason": "stop", "num_tokens": 3, "num_turns": 1, "total_reward": 1.0, "outcome": 1.0,
            "advantage": 0.0, "action": "keep", "reason": None, "metadata": {},
            "segments": [{"length": 2, "messages": turn}, {"length": 1, "messages": None}],
            "segment_advantages": [0.5, -0.5]}


@pytest.mark.parametrize(("option", "arguments_out"), [("object", {"expr": "6*7"}), ("string", '{"expr": "6*7"}')])
def test_segments_follow_the_export_options(option, arguments_out):
    """A segmented trajectory's segments[].messages are written with the same options as its messages."""
    from service.export.formats import Options, rollouts

    [row] = rollouts([_segmented_row()], Options(format="rollouts", tool_arguments=option))
    assert row["messages"][0]["tool_calls"][0]["function"]["arguments"] == arguments_out
    first, last = row["segments"]
    assert first["messages"][0]["tool_calls"][0]["function"]["arguments"] == arguments_out
    assert (first["advantage"], last["advantage"], last["messages"], last["is_last"]) == (0.5, -0.5, None, True)
