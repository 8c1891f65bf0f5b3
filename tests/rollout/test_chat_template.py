"""A real Hugging Face tokenizer (built in code over a tiny WordLevel model, no download) renders a chat
to token ids through one helper, for the producer (``render_prompt``) and ``grpo-curator infer`` alike:
the ids, not the keys of transformers 5's BatchEncoding."""

from __future__ import annotations

from typing import Any

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import PreTrainedTokenizerFast

from rollout.tasks import chat_template_ids, render_prompt

WORDS = ["<pad>", "<s>", "</s>", "<unk>", "user:", "assistant:", "tools:", "add", "2", "and", "3", "yes"]
TEMPLATE = ("<s>{% if tools %}tools: {% for t in tools %}{{ t['function']['name'] }} {% endfor %}</s> {% endif %}"
            "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} </s> {% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    model = WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>")
    raw = Tokenizer(model)
    raw.pre_tokenizer = WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                  unk_token="<unk>")
    tok.chat_template = TEMPLATE
    return tok


def ids(*words: str) -> list[int]:
    return [WORDS.index(w) for w in words]


MESSAGES: list[dict[str, Any]] = [{"role": "user", "content": "add 2 and 3"},
                                  {"role": "assistant", "content": "yes"}]


def test_render_prompt_gives_the_templates_token_ids(tokenizer: PreTrainedTokenizerFast) -> None:
    expected = ids("<s>", "user:", "add", "2", "and", "3", "</s>", "assistant:", "yes", "</s>", "assistant:")
    assert render_prompt(tokenizer, MESSAGES) == expected
    assert chat_template_ids(tokenizer, MESSAGES) == expected


def test_tools_are_rendered_by_the_template(tokenizer: PreTrainedTokenizerFast) -> None:
    tools = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    got = chat_template_ids(tokenizer, MESSAGES[:1], tools)
    assert got == ids("<s>", "tools:", "add", "</s>", "user:", "add", "2", "and", "3", "</s>", "assistant:")


def test_infer_renders_with_the_same_helper(tokenizer: PreTrainedTokenizerFast) -> None:
    from rollout.infer import Engine, tiny_model

    engine = Engine(tiny_model(), tokenizer, "wordlevel")
    assert engine.render(MESSAGES, None) == render_prompt(tokenizer, MESSAGES)


def test_a_template_that_gives_a_batch_encoding_still_gives_ids(tokenizer: PreTrainedTokenizerFast) -> None:
    class DictReturning:  # transformers 5's default (return_dict=True) shape, whatever is asked
        def apply_chat_template(self, messages: Any, **kwargs: Any) -> Any:
            return tokenizer.apply_chat_template(messages, **{**kwargs, "return_dict": True})

    assert chat_template_ids(DictReturning(), MESSAGES) == render_prompt(tokenizer, MESSAGES)
