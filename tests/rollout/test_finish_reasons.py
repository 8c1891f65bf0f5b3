"""A completion the engine gave up on is `aborted`, never an answer (`stop`)."""

from __future__ import annotations

import pytest

from rollout.episodes import multi_turn
from rollout.sampler import Completion, vllm_finish_reason
from rollout.tasks import EOS, TOOLS, CharTokenizer


@pytest.mark.parametrize(("vllm", "ours"), [("stop", "stop"), ("length", "length"), ("abort", "aborted"),
                                            (None, "aborted"), ("preempted-new-reason", "aborted")])
def test_vllm_finish_reasons(vllm, ours):
    assert vllm_finish_reason(vllm) == ours


class ScriptedSampler:
    """A sampler that answers a fixed list of completions, one per call (stands in for an engine)."""

    def __init__(self, completions: list[Completion]):
        self.completions = list(completions)

    def sample(self, prompt_ids, n, max_tokens, seed, **_):
        return [self.completions.pop(0)]

    def close(self) -> None:
        pass


def test_an_aborted_turn_ends_the_episode_as_aborted():
    tok = CharTokenizer("".join(sorted(set("<call>calc(2+3)</call>5=abcd"))))
    call = tok.encode("<call>calc(2+3)</call>") + [EOS]
    sampler = ScriptedSampler([Completion(call, [-0.1] * len(call), "stop"),
                               Completion(tok.encode("5"), [-0.2], "aborted")])
    prompt = tok.render_prompt([{"role": "user", "content": "2+3="}])
    episode = multi_turn(sampler, tok, prompt, tools=TOOLS, max_turns=4, max_tokens=30, seed=0)
    assert episode["finish_reason"] == "aborted"
