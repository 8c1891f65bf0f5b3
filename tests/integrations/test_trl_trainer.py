"""A real TRL client: GRPOTrainer trains a tiny random model for 2 steps on CPU, rewarded by the live
service through integrations.trl.reward_funcs (nothing is downloaded: model and tokenizer are built here)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.integrations.conftest import char_tokenizer

pytest.importorskip("trl")
def tiny_model(vocab_size: int):
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=1)
    return AutoModelForCausalLM.from_config(config)


TRL_SPEC = {"name": "trl", "components": [
    {"name": "correct", "kind": "verifier.exact_match", "outcome": True, "params": {"extract_pattern": "(\\d+)"}},
    {"name": "words", "kind": "rule.length", "weight": 0.5, "params": {"target": 0, "limit": 8, "unit": "words"}},
    # a user's verl-style function in the killable pool; its spread gives GRPO a non-zero advantage
    {"name": "checksum", "kind": "python.function", "weight": 0.1, "params": {"name": "checksum"}},
]}


def recording(func):
    """The same reward function (same name), keeping what it was given and what it answered."""
    seen: list[tuple[list, list]] = []

    def wrapped(prompts, completions, completion_ids=None, **kwargs):
        values = func(prompts, completions, completion_ids, **kwargs)
        seen.append((list(completions), list(values)))
        return values

    wrapped.__name__ = func.__name__
    return wrapped, seen


@pytest.fixture()
def keyed_service(make_db, tmp_path: Path):
    """The integration service with keys on: an admin key posts the spec, the trainer uses a trainer key."""
    from service.auth import keys
    from service.store.db import get_engine, make_sessionmaker
    from tests.conftest import start_server, stop_server
    from tests.integrations.conftest import service_env

    db = make_db()
    with make_sessionmaker(get_engine(db)).begin() as s:
        admin, trainer = keys.create_key(s, "ops", "admin"), keys.create_key(s, "rl", "trainer")
    server = start_server(db, env=service_env(tmp_path))
    try:
        yield server, admin, trainer
    finally:
        stop_server(server)


def test_grpo_trainer_two_steps_with_service_rewards(keyed_service, tmp_path: Path) -> None:
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from grpo_curator_integrations.trl import reward_funcs

    service, admin, trainer_key = keyed_service
    httpx.post(f"{service.url}/v1/reward-specs", json=TRL_SPEC, headers={"authorization": f"Bearer {admin}"}).raise_for_status()
    assert httpx.get(f"{service.url}/v1/reward-specs/trl").status_code == 401
    funcs, weights = reward_funcs("trl", url=service.url, api_key=trainer_key)  # a trainer key: reads the spec, scores
    (correct, correct_seen), (words, words_seen) = recording(funcs[0]), recording(funcs[1])
    assert [f.__name__ for f in funcs] == ["correct", "words", "checksum"]
    tokenizer = char_tokenizer()
    model = tiny_model(len(tokenizer))
    before = [p.detach().clone() for p in model.parameters()]
    dataset = Dataset.from_dict({"prompt": ["6*7=?", "2+3=?", "9*9=?", "1+1=?"], "answer": ["42", "5", "81", "2"]})
    args = GRPOConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=8, learning_rate=1e-2, logging_steps=1, report_to="none",
                      save_strategy="no", use_cpu=True, bf16=False, reward_weights=weights, beta=0.0,
                      dataloader_num_workers=0, seed=0)
    trainer = GRPOTrainer(model=model, reward_funcs=[correct, words, funcs[2]], args=args, train_dataset=dataset,
                          processing_class=tokenizer)
    trainer.train()

    assert trainer.state.global_step == 2 and weights == [1.0, 0.5, 0.1]
    assert [len(c) for c, _ in correct_seen] == [4, 4] and len(words_seen) == 2
    logs = [e for e in trainer.state.log_history if "rewards/correct/mean" in e]
    assert len(logs) == 2
    for log, (completions, values), (_, word_values) in zip(logs, correct_seen, words_seen, strict=True):
        # what the trainer got is what the service answers for those completions
        again = httpx.post(f"{service.url}/v1/score", headers={"authorization": f"Bearer {trainer_key}"}, json={"reward_spec": "trl", "items": [
            {"prompt": "", "completion": c, "reference": {"answer": "0"}} for c in completions]}).json()
        assert word_values == [r["rewards"]["words"]["value"] for r in again["results"]]
        assert all(v in (0.0, 1.0) for v in values)
        assert log["rewards/correct/mean"] == pytest.approx(sum(values) / 4)
        assert log["rewards/words/mean"] == pytest.approx(sum(word_values) / 4)
        assert log["rewards/checksum/std"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
