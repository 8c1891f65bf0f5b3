"""The producer's sampling and episode building on a real tiny random-initialised model."""

from __future__ import annotations

import pytest
import torch

from rollout.episodes import multi_turn, single_turn
from rollout.sampler import HFSampler
from rollout.tasks import EOS, TOOLS, CharTokenizer, calculator
from trainer.worker import TrainerConfig, build_model, tiny_model_config

ALPHABET = "".join(sorted(set("<call>calc(2+3)</call>5=abcd")))


@pytest.fixture(scope="module")
def tok():
    return CharTokenizer(ALPHABET)


@pytest.fixture(scope="module")
def sampler(tok):
    model = build_model(TrainerConfig(model_config=tiny_model_config(vocab_size=tok.vocab_size), seed=3))
    return HFSampler(model, eos_token_id=EOS, pad_token_id=0)


def forced(sequence: list[int]):
    """prefix_allowed_tokens_fn that makes generate follow ``sequence`` (the model still scores it)."""
    def allowed(_batch: int, ids: torch.Tensor) -> list[int]:
        return [sequence[len(ids)]] if len(ids) < len(sequence) else [EOS]
    return allowed


def test_behaviour_logprobs_match_a_forward_pass(tok, sampler):
    prompt = tok.render_prompt([{"role": "user", "content": "ab="}])
    completions = sampler.sample(prompt, n=4, max_tokens=6, seed=7)
    assert len(completions) == 4
    for c in completions:
        traj = single_turn(prompt, c, tok.decode(c.tokens))
        ids = torch.tensor([traj["token_ids"]])
        with torch.no_grad():
            logp = torch.log_softmax(sampler.model(ids).logits[0, :-1].float(), -1)  # (T-1, V)
        ref = logp.gather(-1, ids[0, 1:, None]).squeeze(-1)
        mask = torch.tensor(traj["loss_mask"][1:], dtype=torch.bool)
        got = torch.tensor(traj["logprobs"][1:])
        assert torch.allclose(got[mask], ref[mask], atol=1e-4)
        assert traj["loss_mask"] == [0] * len(prompt) + [1] * len(c.tokens)


def test_same_seed_same_samples_and_budget_gives_length(tok, sampler):
    prompt = tok.render_prompt([{"role": "user", "content": "cd="}])
    a = sampler.sample(prompt, n=3, max_tokens=5, seed=11)
    b = sampler.sample(prompt, n=3, max_tokens=5, seed=11)
    assert a == b
    no_eos = [tok.encode("a")[0]] * 10
    [cut] = sampler.sample(prompt, n=1, max_tokens=3, seed=1, prefix_allowed_tokens_fn=forced(prompt + no_eos))
    assert cut.finish_reason == "length" and len(cut.tokens) == 3 and EOS not in cut.tokens


def test_multi_turn_tool_episode_masks_observations(tok, sampler):
    prompt = tok.render_prompt([{"role": "user", "content": "ab="}])
    turn1, obs, turn2 = tok.encode("<call>calc(2+3)</call>") + [EOS], tok.encode("5"), tok.encode("5") + [EOS]
    script = prompt + turn1 + obs + turn2
    traj = multi_turn(sampler, tok, prompt, tools=TOOLS, max_turns=3, max_tokens=40, seed=0,
                      prefix_allowed_tokens_fn=forced(script))
    assert traj["finish_reason"] == "stop"
    assert traj["token_ids"] == script
    assert traj["loss_mask"] == [0] * len(prompt) + [1] * len(turn1) + [0] * len(obs) + [1] * len(turn2)
    assert [m["role"] for m in traj["messages"]] == ["assistant", "tool", "assistant"]
    assert traj["messages"][0]["tool_calls"][0]["function"] == {"name": "calc", "arguments": "2+3"}
    assert traj["messages"][1] == {"role": "tool", "content": "5", "tool_call_id": "call-0"}
    assert traj["final_answer"] == "5"
    assert all(lp == 0.0 for lp, m in zip(traj["logprobs"], traj["loss_mask"], strict=True) if m == 0)
    assert len(traj["logprobs"]) == len(script)


def test_tool_failure_and_turn_budget(tok, sampler):
    prompt = tok.render_prompt([{"role": "user", "content": "ab="}])
    bad = tok.encode("<call>calc(2+)</call>") + [EOS]
    traj = multi_turn(sampler, tok, prompt, tools=TOOLS, max_turns=3, max_tokens=40, seed=0,
                      prefix_allowed_tokens_fn=forced(prompt + bad))
    # calc rejects "2+" (a syntax error in the model's arguments): the model's mistake, not noise
    assert traj["finish_reason"] == "tool_misuse" and traj["messages"][-1]["content"].startswith("error:")
    call = tok.encode("<call>calc(2+3)</call>") + [EOS]
    loop = prompt + call + tok.encode("5") + call + tok.encode("5")
    traj = multi_turn(sampler, tok, prompt, tools=TOOLS, max_turns=2, max_tokens=40, seed=0,
                      prefix_allowed_tokens_fn=forced(loop))
    assert traj["finish_reason"] == "max_turns" and len(traj["messages"]) == 4


def test_unknown_tool_is_the_models_mistake_and_a_broken_tool_the_environments(tok, sampler):
    prompt = tok.render_prompt([{"role": "user", "content": "ab="}])
    call = tok.encode("<call>calc(2+3)</call>") + [EOS]
    forced_call = forced(prompt + call)

    def backend_down(_args: str) -> str:
        raise ConnectionError("search backend unreachable")

    unknown = multi_turn(sampler, tok, prompt, tools={"search": calculator}, max_turns=3, max_tokens=40, seed=0,
                         prefix_allowed_tokens_fn=forced_call)
    assert unknown["finish_reason"] == "tool_misuse"
    broken = multi_turn(sampler, tok, prompt, tools={"calc": backend_down}, max_turns=3, max_tokens=40, seed=0,
                        prefix_allowed_tokens_fn=forced_call)
    assert broken["finish_reason"] == "tool_failure"
    assert broken["messages"][-1]["content"] == "error: search backend unreachable"


def test_calculator_parses_instead_of_evaluating():
    assert calculator("6*7") == "42"
    with pytest.raises(ValueError):
        calculator("__import__('os')")


def test_special_tokens_in_generated_text_are_visible(tok):
    a = tok.encode("a")[0]
    assert tok.decode([a, 0, 1]) == "a\ufffd\ufffd"  # padding an answer cannot pass a one-letter check
