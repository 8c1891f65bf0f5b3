"""Small pieces the rollout producer and the demo need without downloads: a character tokenizer, a
synthetic task a tiny random-initialised model can learn on CPU, and a registry of Python tools."""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rollout.tools import ToolArgumentError

PAD, BOS, EOS = 0, 1, 2
_SPECIALS = 3


@dataclass(frozen=True)
class CharTokenizer:
    """One token per character of ``alphabet`` after PAD / BOS / EOS. ``vocab_size`` = 3 + len(alphabet)."""

    alphabet: str
    pad_token_id: int = PAD
    bos_token_id: int = BOS
    eos_token_id: int = EOS

    def __post_init__(self) -> None:
        if len(set(self.alphabet)) != len(self.alphabet):
            raise ValueError("alphabet: characters must be unique")

    @property
    def vocab_size(self) -> int:
        return _SPECIALS + len(self.alphabet)

    def encode(self, text: str) -> list[int]:
        try:
            return [_SPECIALS + self.alphabet.index(c) for c in text]
        except ValueError:
            bad = next(c for c in text if c not in self.alphabet)
            raise ValueError(f"text: character {bad!r} is not in the tokenizer's alphabet") from None

    def decode(self, ids: list[int]) -> str:
        """Special tokens inside generated text become U+FFFD, never nothing: a policy must not be able to
        pad an answer with PAD / BOS tokens that a verifier cannot see (a reward hack seen in the demo)."""
        return "".join(self.alphabet[i - _SPECIALS] if i >= _SPECIALS else "\ufffd" for i in ids)

    def render_prompt(self, messages: list[dict[str, Any]]) -> list[int]:
        """BOS + the text of every message (this tokenizer has no chat template)."""
        return [BOS] + self.encode("".join(str(m.get("content") or "") for m in messages))


def load_tokenizer(spec: str) -> Any:
    """``char:<alphabet>`` -> CharTokenizer; anything else is a transformers tokenizer path."""
    if spec.startswith("char:"):
        return CharTokenizer(spec[len("char:") :])
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(spec)


def render_prompt(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    if isinstance(tokenizer, CharTokenizer):
        return tokenizer.render_prompt(messages)
    return chat_template_ids(tokenizer, messages)


def chat_template_ids(tokenizer: Any, messages: list[dict[str, Any]], tools: list[Any] | None = None) -> list[int]:
    """A transformers tokenizer's chat template rendered to token ids (with the generation prompt).
    transformers 5 returns a BatchEncoding from ``tokenize=True`` (whose ``list()`` is its keys), 4 a list:
    ask for the plain list, and take ``input_ids`` from a mapping either way."""
    out = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
    if hasattr(out, "keys") and "input_ids" in out:
        out = out["input_ids"]
    ids = list(out)
    if ids and isinstance(ids[0], list):  # a batch of one
        (ids,) = ids
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise TypeError(f"apply_chat_template gave {type(out).__name__}, not token ids")
    return [int(t) for t in ids]


# -- the demo task -----------------------------------------------------------------------------------
LETTERS = "abcd"
DEMO_ALPHABET = LETTERS + "="


def letter_sum_prompts(letters: str = LETTERS, dataset: str = "letter-sum") -> list[dict[str, Any]]:
    """``xy=`` -> the letter at (index(x) + index(y)) mod K: K*K prompts, one answer each.

    A random-initialised model answers a letter and then stops ~1/64 of the time, so most groups of 8 start
    all-fail (zero variance) and many samples hit the token budget; learning turns them into all-correct groups.
    """
    k = len(letters)
    return [
        {
            "id": f"{dataset}-{x}{y}",
            "dataset": dataset,
            "messages": [{"role": "user", "content": f"{x}{y}="}],
            "reference": {"answer": letters[(i + j) % k]},
        }
        for i, x in enumerate(letters)
        for j, y in enumerate(letters)
    ]


def mixed_letter_sum_prompts(
    letters: str = LETTERS, dataset: str = "letter-sum-mixed", widths: tuple[int, ...] = (1, 2)
) -> list[dict[str, Any]]:
    """Letter-sum with 1, 2 (, 3) operands (``x=``, ``xy=``, ``xyz=``): the letter at the sum of the indices
    mod K; sum(K^w) prompts of mixed difficulty. The 1-operand ones (copy the letter) are meant to be the
    easy ones and the longer ones stay all-wrong for a while: groups that carry no GRPO signal next to
    groups that do. (In 100-step runs of an earlier bench/curation_effect.py even the copy prompts were not
    learned and every arm sat at the chance rate; the benchmark now runs *letter-map*, bench/curation_effect.py.)"""
    k = len(letters)
    out = []
    for width in widths:
        for combo in range(k**width):
            idx = [(combo // k**p) % k for p in range(width)]
            text = "".join(letters[i] for i in idx)
            out.append({"id": f"{dataset}-{text}", "dataset": dataset,
                        "messages": [{"role": "user", "content": f"{text}="}],
                        "reference": {"answer": letters[sum(idx) % k]}})
    return out


def letter_sum_spec(name: str = "letter-sum") -> dict[str, Any]:
    """Outcome: the answer is exactly the right letter (then EOS). No SQuAD normalisation: it would strip
    the article-like letter "a" and punctuation such as "=" to "", making "=" match the answer "a"."""
    return {
        "name": name,
        "components": [
            {"name": "correct", "kind": "verifier.exact_match", "outcome": True, "weight": 1.0,
             "params": {"normalize": False}},
        ],
    }


# -- tools for multi-turn episodes -------------------------------------------------------------------
_OPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


MAX_EXPRESSION_CHARS = 200  # a calculator call longer than this is refused: the model's, not the tool's failure
MAX_RESULT_DIGITS = 100  # every literal and intermediate value stays below 10**100 (no huge-int blow-up)


def calculator(expression: str) -> str:
    """Integer arithmetic (+ - * // %) on literals only: parsed, never evaluated as code. An expression it
    cannot compute is refused as the model's mistake (``ToolArgumentError``): syntax, operators it lacks,
    division by zero, more than ``MAX_EXPRESSION_CHARS`` characters or nesting Python cannot parse, and a
    literal or intermediate value of ``MAX_RESULT_DIGITS`` digits or more. Nothing the model writes makes it
    raise anything else, so no expression passes for the environment's failure (``tool_failure``)."""
    bound = 10**MAX_RESULT_DIGITS

    def checked(value: int) -> int:
        if abs(value) >= bound:
            raise ToolArgumentError(f"out of range: a value of {MAX_RESULT_DIGITS} digits or more")
        return value

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return checked(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            value = ev(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return checked(_OPS[type(node.op)](ev(node.left), ev(node.right)))
        raise ToolArgumentError(f"unsupported expression: {ast.dump(node)[:60]}")

    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolArgumentError(f"expression: longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        return str(ev(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError) as exc:  # ValueError: a NUL byte, or a literal past int's digit limit
        raise ToolArgumentError(f"not an expression: {getattr(exc, 'msg', None) or exc}"[:200]) from None
    except (RecursionError, MemoryError):
        raise ToolArgumentError("expression: nested too deeply") from None
    except ZeroDivisionError:
        raise ToolArgumentError("division by zero") from None


TOOLS: dict[str, Callable[[str], str]] = {"calc": calculator}
