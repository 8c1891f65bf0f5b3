"""The real verl (0.9.x, installed --no-deps): its own Hydra config composed with the overrides
docs/integrations.md shows, its own loader picking our function, and its own reward managers (0.9's reward
loop and the legacy batch manager) calling it against the live service."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import pytest

from grpo_curator_integrations import verl as ours
from grpo_curator_integrations._http import ScoringError
from tests.conftest import ROOT, LiveServer
from tests.integrations.conftest import char_tokenizer, package_dir, skip_unless_installed

skip_unless_installed(verl="the upstream verl these tests run (make install-dev, or pip install --no-deps verl==0.9.1)",
                      hydra="verl composes its config with hydra-core (the upstream extra of make install-dev)",
                      torch="verl's reward loop builds torch tensors (make install-dev installs torch)")

GOOD, BAD = "<answer>42</answer>", "<answer>41</answer>"
CONFIG_DIR = package_dir("verl") / "trainer" / "config"
LEGACY_FILE = ROOT / "integrations" / "verl.py"  # the path older docs gave: the deprecated shim still loads


def get_custom_reward_fn(config):
    """verl's own loader, reading config.reward.custom_reward_function (verl imported when a test calls it)."""
    from verl.trainer.ppo.reward import get_custom_reward_fn as load

    return load(config)


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=overrides)


def v09_overrides(url: str, name: str = "compute_score_async") -> list[str]:
    """Exactly the docs' verl 0.9 block."""
    return ["reward.custom_reward_function.path=pkg://grpo_curator_integrations.verl",
            f"reward.custom_reward_function.name={name}",
            "+reward.custom_reward_function.reward_kwargs.spec=integ",
            f"+reward.custom_reward_function.reward_kwargs.url={url}"]


def raw_function(fn):
    """What verl's loader wrapped: partial(_call_with_kwargs[_async], raw_fn, reward_kwargs)."""
    return fn.args[0], fn.args[1]


def tokenizer_dir(tmp_path: Path) -> Path:
    path = tmp_path / "tok"
    char_tokenizer().save_pretrained(str(path))
    return path


def dataproto(tok, responses: list[str], truths: list[str], extras: list[dict]):
    """A batch shaped as verl's rollout leaves it: prompts, right-padded responses, attention mask."""
    import torch
    from verl import DataProto

    prompt = tok("6*7=?", add_special_tokens=False)["input_ids"]
    width = max(len(tok(r, add_special_tokens=False)["input_ids"]) for r in responses) + 1
    rows, masks = [], []
    for r in responses:
        ids = [*tok(r, add_special_tokens=False)["input_ids"], tok.eos_token_id]
        rows.append(ids + [tok.pad_token_id] * (width - len(ids)))
        masks.append([1] * len(prompt) + [1] * len(ids) + [0] * (width - len(ids)))
    n = len(responses)
    return DataProto.from_dict(
        tensors={"prompts": torch.tensor([prompt] * n), "responses": torch.tensor(rows),
                 "attention_mask": torch.tensor(masks)},
        non_tensors={"data_source": np.array(["gsm8k"] * n, dtype=object),
                     "reward_model": np.array([{"ground_truth": t} for t in truths], dtype=object),
                     "extra_info": np.array(extras, dtype=object)})


def test_verl_09_config_loads_our_function_with_its_kwargs(service: LiveServer) -> None:
    config = compose(v09_overrides(service.url))
    fn = get_custom_reward_fn(config)  # verl's own loader, reading config.reward.custom_reward_function
    assert fn is not None
    raw, kwargs = raw_function(fn)
    assert raw is ours.compute_score_async and kwargs == {"spec": "integ", "url": service.url}
    assert asyncio.run(fn(data_source="gsm8k", solution_str=GOOD, ground_truth="42")) == \
        {"score": 1.5, "correct": 1.0, "fmt": 1.0}


def test_verl_09_ignores_the_legacy_keys_unless_migrated(service: LiveServer) -> None:
    """The pre-0.9 overrides compose, but 0.9's main_ppo reads only reward.custom_reward_function: our function
    would silently not run. verl's own migration (what its fully-async entry point calls) moves them."""
    from verl.experimental.reward_loop import migrate_legacy_reward_impl

    legacy = [f"custom_reward_function.path={LEGACY_FILE}", "custom_reward_function.name=compute_score_batch",
              "reward_model.reward_manager=batch", "+custom_reward_function.reward_kwargs.spec=integ",
              f"+custom_reward_function.reward_kwargs.url={service.url}"]
    config = compose(legacy)
    assert config.reward.custom_reward_function.path is None and get_custom_reward_fn(config) is None
    with pytest.warns(DeprecationWarning, match="grpo_curator_integrations"):
        fn = get_custom_reward_fn(migrate_legacy_reward_impl(config))
    raw, kwargs = raw_function(fn)
    assert raw.__name__ == "compute_score_batch" and raw.__module__ == "grpo_curator_integrations.verl"
    assert kwargs == {"spec": "integ", "url": service.url}


def test_verl_09_reward_loop_naive_manager_scores_a_batch(service: LiveServer, tmp_path: Path) -> None:
    """verl's RewardLoopWorker (the 0.9 reward loop, naive manager) built from the composed config: it awaits
    compute_score_async once per sample; the samples share requests; each gets its own answer."""
    from verl.experimental.reward_loop import RewardLoopWorker

    tok_path = tokenizer_dir(tmp_path)
    config = compose([*v09_overrides(service.url), f"actor_rollout_ref.model.path={tok_path}"])
    assert config.reward.reward_manager.name == "naive"
    answers = [GOOD, BAD, "42"] * 7
    data = dataproto(char_tokenizer(), answers, ["42"] * len(answers), [{"index": i} for i in range(len(answers))])
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        worker = RewardLoopWorker(config)
        outputs = loop.run_until_complete(worker.compute_score_batch(data))
    finally:
        loop.close()
        asyncio.set_event_loop(None)
    assert [o["reward_score"] for o in outputs] == [1.5, 0.5, 1.0] * 7
    assert [o["reward_extra_info"]["fmt"] for o in outputs] == [1.0, 1.0, 0.0] * 7


def test_verl_legacy_batch_manager_calls_compute_score_batch(service: LiveServer, tmp_path: Path) -> None:
    from verl.experimental.reward_loop import migrate_legacy_reward_impl
    from verl.workers.reward_manager import BatchRewardManager

    legacy = [f"custom_reward_function.path={LEGACY_FILE}", "custom_reward_function.name=compute_score_batch",
              "reward_model.reward_manager=batch", "+custom_reward_function.reward_kwargs.spec=integ",
              f"+custom_reward_function.reward_kwargs.url={service.url}"]
    with pytest.warns(DeprecationWarning):
        fn = get_custom_reward_fn(migrate_legacy_reward_impl(compose(legacy)))
    tok = char_tokenizer()
    manager = BatchRewardManager(tokenizer=tok, num_examine=0, compute_score=fn)
    answers = [GOOD, BAD, "42", GOOD]
    out = manager(dataproto(tok, answers, ["42"] * 4, [{}, {}, {}, {}]), return_dict=True)
    assert out["reward_tensor"].sum(dim=-1).tolist() == [1.5, 0.5, 1.0, 1.5]
    assert out["reward_extra_info"]["correct"] == [1.0, 0.0, 1.0, 1.0]


def test_verl_prompt_from_extra_info_and_tokens_from_the_named_tokenizer(service: LiveServer, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    spec = {"name": "verl-tok", "components": [
        {"name": "correct", "kind": "verifier.exact_match", "outcome": True, "params": {"extract_pattern": "(\\d+)"}},
        {"name": "len", "kind": "rule.length", "params": {"target": 4, "limit": 40, "unit": "tokens"}}]}
    assert httpx.post(f"{service.url}/v1/reward-specs", json=spec).status_code == 201
    kw = {"spec": "verl-tok", "url": service.url}
    monkeypatch.delenv("GRPO_CURATOR_TOKENIZER", raising=False)
    with pytest.raises(ScoringError, match="num_tokens"):  # no count and no tokenizer: an error, never a 0
        ours.compute_score("gsm8k", GOOD, "42", {"question": "6*7?"}, **kw)

    def service_len(n: int) -> float:
        r = httpx.post(f"{service.url}/v1/score", json={"reward_spec": "verl-tok", "items": [
            {"prompt": "q", "completion": GOOD, "reference": {"answer": "42"}, "num_tokens": n}]}).json()
        return r["results"][0]["rewards"]["len"]["value"]

    assert service_len(len(GOOD)) != service_len(len(GOOD) + 10)  # the count matters to this rule
    monkeypatch.setenv("GRPO_CURATOR_TOKENIZER", str(tokenizer_dir(tmp_path)))
    got = ours.compute_score("gsm8k", GOOD, "42", {"question": "6*7?"}, **kw)
    assert got["len"] == service_len(len(GOOD))  # the char tokenizer: one token per character
    given = ours.compute_score("gsm8k", GOOD, "42", {"num_tokens": len(GOOD) + 10}, **kw)
    assert given["len"] == service_len(len(GOOD) + 10)  # a count the caller gives wins
    with pytest.raises(ValueError, match="GRPO_CURATOR_TOKENIZER"):
        ours.compute_score("gsm8k", GOOD, "42", tokenizer=str(tmp_path / "nowhere"), **kw)
    # the prompt: extra_info.prompt (string or messages), else .question
    assert ours._item("d", GOOD, "42", {"question": "6*7?"})["prompt"] == "6*7?"
    chat = [{"role": "user", "content": "6*7?"}]
    assert ours._item("d", GOOD, "42", {"prompt": chat, "question": "x"})["prompt"] == chat
    assert ours._item("d", GOOD, "42", {"prompt": 3})["prompt"] == ""
