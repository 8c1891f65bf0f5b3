"""judge.reward_model with a tiny random-initialised model built from a config (no downloads)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from reward_models import make_component
from tests.reward_models.helpers import make_prompt, make_sample

TINY_LLAMA = {
    "model_type": "llama",
    "vocab_size": 260,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}
ANSWERS = ["42", "The answer is 42 because six times seven is forty-two.", "", "I don't know", "4" * 300]


def rm(**params: object):
    return make_component("judge.reward_model", {"config": TINY_LLAMA, "device": "cpu", **params})


def items(answers: list[str] = ANSWERS) -> list:
    return [(make_sample(a), make_prompt()) for a in answers]


def values(component, answers: list[str] = ANSWERS) -> list[float]:
    results = component.score_batch(items(answers))
    assert all(r.error is None for r in results), [r.error for r in results]
    return [r.value for r in results]


def test_batched_scores_equal_one_at_a_time() -> None:
    """Padding and length-sorting must not change any score (right padding + attention mask)."""
    component = rm(batch_size=3, max_length=256)
    batched = values(component)
    single = [component.score(s, p).value for s, p in items()]
    assert batched == pytest.approx(single, abs=1e-5)
    assert len(set(round(v, 6) for v in batched)) == len(ANSWERS)  # different texts, different logits


def test_same_seed_same_model_other_seed_other_model() -> None:
    assert values(rm()) == pytest.approx(values(rm()), abs=1e-6)
    assert values(rm(seed=1)) != pytest.approx(values(rm()), abs=1e-6)


def test_truncation_keeps_the_end_of_the_text() -> None:
    component = rm(max_length=16)
    a, b = values(component, ["x" * 100 + " the same long ending", "y" * 100 + " the same long ending"])
    assert a == pytest.approx(b, abs=1e-6)  # only the last 16 bytes are read
    result = component.score(make_sample("z" * 100), make_prompt())
    assert result.details["num_tokens"] == 16


def test_saved_model_loads_from_path(tmp_path: Path) -> None:
    built = rm()
    built.load()
    built._model.save_pretrained(tmp_path)
    loaded = make_component(
        "judge.reward_model", {"model_path": str(tmp_path), "tokenizer": "bytes", "device": "cpu"}
    )
    assert values(loaded) == pytest.approx(values(built), abs=1e-5)


def test_load_failures_are_errors_for_every_item(tmp_path: Path) -> None:
    missing = make_component(
        "judge.reward_model", {"model_path": str(tmp_path / "nope"), "tokenizer": "bytes"}
    )
    results = missing.score_batch(items())
    assert all(r.value is None and "could not load the reward model" in (r.error or "") for r in results)
    small_vocab = rm(config={**TINY_LLAMA, "vocab_size": 100})
    assert "needs vocab_size > 256" in (small_vocab.score(*items()[0]).error or "")


def test_transcript_mode_reads_tool_turns() -> None:
    sample = make_sample(
        "42",
        messages=[
            {"role": "assistant", "content": "calling the calculator"},
            {"role": "tool", "content": "42", "tool_call_id": "c1"},
            {"role": "assistant", "content": "42"},
        ],
    )
    component = rm(response="transcript")
    component.load()
    assert "tool: 42" in component.text(sample, make_prompt())
    assert rm().score(sample, make_prompt()).value != pytest.approx(
        component.score(sample, make_prompt()).value
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_matches_cpu() -> None:
    gpu = values(rm(device="cuda", dtype="float32"))
    assert gpu == pytest.approx(values(rm()), abs=1e-3)
    assert rm(device="auto").score(*items()[0]).value == pytest.approx(
        make_component("judge.reward_model", {"config": TINY_LLAMA, "device": "cuda", "dtype": "bfloat16"})
        .score(*items()[0])
        .value
    )


def save_word_tokenizer(path: Path) -> int:
    """A whitespace word-level tokenizer (no pad token, eos only), saved like a hub tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = "user assistant : what is 6 * 7 ? 42 the answer i don't know".split()
    vocab = {w: i for i, w in enumerate(["[UNK]", "</s>", *dict.fromkeys(words)])}
    inner = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    inner.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=inner, unk_token="[UNK]", eos_token="</s>").save_pretrained(path)
    return len(vocab)


def test_tokenizer_from_a_path(tmp_path: Path) -> None:
    vocab_size = save_word_tokenizer(tmp_path)
    component = rm(config={**TINY_LLAMA, "vocab_size": vocab_size}, tokenizer=str(tmp_path), batch_size=4)
    answers = ["42", "the answer is 42", "i don't know the answer", "what ?"]
    batched = values(component, answers)
    assert batched == pytest.approx([component.score(s, p).value for s, p in items(answers)], abs=1e-5)
    assert component._tokenizer.pad_token_id == 1  # no pad token: falls back to eos


def test_hostile_text_in_one_item_neither_errors_nor_fails_its_batch() -> None:
    """A lone surrogate (the byte tokenizer's UTF-8 cannot encode it) and parts whose text is not a
    string are the model's text: scored, and the rest of the batch with them."""
    odd = [{"role": "assistant", "content": [{"type": "text", "text": 5}, {"type": "text", "text": "42 \udfff"}]},
           {"role": "assistant", "content": 7}, "not a message"]
    batch = [(make_sample("42 \ud800"), make_prompt()), (make_sample("42"), make_prompt()),
             (make_sample("42", messages=odd), make_prompt())]
    for component in (rm(), rm(response="transcript")):
        results = component.score_batch(batch)
        assert [r.error for r in results] == [None, None, None]
        assert all(isinstance(r.value, float) for r in results)
    assert rm().text(*batch[0]).endswith("42 \ufffd")
    assert rm(response="transcript").text(*batch[2]).endswith("assistant: 42 \ufffd\nassistant: ")
