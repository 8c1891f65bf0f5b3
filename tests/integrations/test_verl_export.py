"""The ``verl`` export read by verl's own loader: a Parquet file from ``GET /v1/export?format=verl`` goes
through verl 0.9's ``RLHFDataset`` (with the data config its Hydra ``ppo_trainer`` composes and a tiny
in-code tokenizer with a chat template), and its rows arrive as verl's reward loop reads them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from reward_models.scoring import Scorer
from service.store.db import get_engine, make_sessionmaker
from service.worker.pipeline import drain
from tests.helpers import make_group
from tests.integrations.conftest import char_tokenizer, package_dir, skip_unless_installed

skip_unless_installed(verl="the upstream verl these tests run (make install-dev, or pip install --no-deps verl==0.9.1)",
                      hydra="verl composes its config with hydra-core (the upstream extra of make install-dev)",
                      datasets="verl's RLHFDataset reads Parquet through datasets (the upstream extra of make install-dev)")
CONFIG_DIR = package_dir("verl") / "trainer" / "config"
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
QUESTION = "what is 6 * 7?"


def tokenizer():
    tok = char_tokenizer()
    tok.chat_template = TEMPLATE
    return tok


def data_config(files: list[str], **overrides):
    """``config.data`` exactly as verl's ``ppo_trainer`` composes it (what main_ppo hands RLHFDataset)."""
    from hydra import compose, initialize_config_dir

    args = [f"data.train_files=[{','.join(files)}]", f"data.val_files=[{','.join(files)}]",
            *(f"data.{k}={v}" for k, v in overrides.items())]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=args)
    return cfg.data


@pytest.fixture(scope="module")
def exported(make_db, tmp_path_factory) -> Iterator[Path]:
    from service.app import create_app

    url = make_db()
    group = make_group("v-0", prompt_id="v-math", dataset="gsm8k", answers=["42", "41"], reference={"answer": "42"})
    group["prompt"]["messages"] = [{"role": "system", "content": "be brief"}, {"role": "user", "content": QUESTION}]
    with TestClient(create_app(database_url=url)) as client:
        assert client.post("/v1/groups", json=group).status_code == 201
        with Scorer(processes=1, timeout_s=10) as scorer:
            drain(make_sessionmaker(get_engine(url)), scorer, timeout_s=120)
        r = client.get("/v1/export", params={"format": "verl", "filetype": "parquet"})
        assert r.status_code == 200, r.text
    path = tmp_path_factory.mktemp("verl") / "train.parquet"
    path.write_bytes(r.content)
    yield path


def test_rlhf_dataset_reads_the_export_and_the_prompt_renders(exported, tmp_path):
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    cfg = data_config([str(exported)], max_prompt_length=256, filter_overlong_prompts_workers=1)
    OmegaConf.update(cfg, "cache_dir", str(tmp_path / "cache"), force_add=True)
    tok = tokenizer()
    ds = RLHFDataset(data_files=[str(exported)], tokenizer=tok, config=cfg)
    assert len(ds) == 1
    row = ds[0]
    assert row["raw_prompt"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": QUESTION}]
    # what verl's agent loop does with raw_prompt: the chat template, generation prompt added
    rendered = tok.apply_chat_template(row["raw_prompt"], add_generation_prompt=True, tokenize=False)
    assert rendered == f"<system>be brief</system><user>{QUESTION}</user><assistant>"
    # verl's reward loop: non_tensor_batch["data_source"], ["reward_model"]["ground_truth"], ["extra_info"]
    batch = collate_fn([row])
    assert batch["data_source"].tolist() == ["gsm8k"]
    (reward_model,) = batch["reward_model"].tolist()
    assert reward_model["ground_truth"] == "42" and reward_model["style"] == "rule"
    (extra,) = batch["extra_info"].tolist()
    assert extra["prompt_id"] == "v-math" and extra["index"] == 0
    assert batch["ability"].tolist() == ["math"]


def test_verl_filters_an_export_row_whose_rendered_prompt_is_too_long(exported, tmp_path):
    """verl's own length filter renders our prompt with the chat template and counts its tokens: the
    rendered prompt is one token per character here, so a limit one below its length drops the row."""
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    tok = tokenizer()
    n = len(tok.apply_chat_template([{"role": "system", "content": "be brief"}, {"role": "user", "content": QUESTION}],
                                    add_generation_prompt=True, tokenize=False))
    for limit, rows in ((n, 1), (n - 1, 0)):
        cfg = data_config([str(exported)], max_prompt_length=limit, filter_overlong_prompts=True,
                          filter_overlong_prompts_workers=1)  # off in ppo_trainer's defaults
        OmegaConf.update(cfg, "cache_dir", str(tmp_path / "cache"), force_add=True)
        assert len(RLHFDataset(data_files=[str(exported)], tokenizer=tok, config=cfg)) == rows


@pytest.fixture(scope="module")
def exported_references(make_db, tmp_path_factory) -> Path:
    """An export with a math prompt and one whose reference has neither answer nor tests / io (a schema)."""
    from service.app import create_app

    url = make_db()
    math = make_group("r-0", prompt_id="r-math", dataset="gsm8k", answers=["42", "41"], reference={"answer": "42"})
    math["prompt"]["messages"] = [{"role": "user", "content": QUESTION}]
    schema = make_group("r-1", prompt_id="r-schema", dataset="forms", answers=["{}", "[]"],
                        reference={"schema": {"type": "object"}})
    schema["prompt"]["messages"] = [{"role": "user", "content": QUESTION}]
    spec = {"name": "schema-only", "components": [{"name": "valid", "kind": "verifier.json_schema", "outcome": True}]}
    with TestClient(create_app(database_url=url)) as client:
        assert client.post("/v1/reward-specs", json=spec).status_code == 201
        assert client.put("/v1/datasets/forms", json={"reward_spec": "schema-only"}).status_code == 200
        for g in (math, schema):
            assert client.post("/v1/groups", json=g).status_code == 201, g
        with Scorer(processes=1, timeout_s=10) as scorer:
            drain(make_sessionmaker(get_engine(url)), scorer, timeout_s=120)
        r = client.get("/v1/export", params={"format": "verl", "filetype": "parquet"})
        assert r.status_code == 200, r.text
    path = tmp_path_factory.mktemp("verl-refs") / "train.parquet"
    path.write_bytes(r.content)
    return path


def test_verls_reward_loop_gets_the_prompt_and_the_reference(exported_references, tmp_path):
    """What verl's reward loop hands compute_score (data_source, reward_model.ground_truth, extra_info) after
    RLHFDataset: the prompt is in extra_info (verl passes none), and no row with a reference has a null
    ground truth; the grpo-curator adapter scores the stored reference."""
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    from grpo_curator_integrations.verl import _item

    cfg = data_config([str(exported_references)], max_prompt_length=256, filter_overlong_prompts_workers=1)
    OmegaConf.update(cfg, "cache_dir", str(tmp_path / "cache"), force_add=True)
    ds = RLHFDataset(data_files=[str(exported_references)], tokenizer=tokenizer(), config=cfg)
    batch = collate_fn([ds[i] for i in range(len(ds))])
    rows = {e["prompt_id"]: (s, rm["ground_truth"], e) for s, rm, e in
            zip(batch["data_source"].tolist(), batch["reward_model"].tolist(), batch["extra_info"].tolist(),
                strict=True)}
    assert sorted(rows) == ["r-math", "r-schema"]
    for source, truth, extra in rows.values():
        assert truth is not None
        assert [dict(m) for m in extra["prompt"]] == [{"role": "user", "content": QUESTION}]
        item = _item(source, "{}", truth, extra)
        assert item["prompt"] and item["prompt"][-1]["role"] == "user"
    _, truth, extra = rows["r-schema"]
    assert json.loads(truth) == {"schema": {"type": "object"}}
    assert _item("gsm8k", "{}", truth, extra)["reference"] == {"schema": {"type": "object"}}
    _, truth, extra = rows["r-math"]
    assert truth == "42" and _item("gsm8k", "42", truth, extra)["reference"] == {"answer": "42"}
