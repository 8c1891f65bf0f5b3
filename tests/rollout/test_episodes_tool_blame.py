"""Whose failure a tool call is, decided by its arguments (rollout.tools): an unknown name, arguments that fail
the tool's check before it runs, or the tool's explicit refusal are the model's (``tool_misuse``); anything a
tool raises while running on arguments that passed is the environment's (``tool_failure``), whatever the
exception's type -- a search backend's HTML error page (``ValueError`` from ``json.loads``) or JSON without
the expected key (``KeyError``) is not the model's fault."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from rollout.episodes import multi_turn
from rollout.infer import AsciiTokenizer
from rollout.sampler import Completion
from rollout.tasks import calculator
from rollout.tools import Tool, ToolArgumentError, ToolLike

TOK = AsciiTokenizer()


class OneCall:
    """A sampler whose every turn is the same tool call (stands in for an engine)."""

    def __init__(self, text: str) -> None:
        self.tokens = TOK.encode(text) + [TOK.eos_token_id]

    def sample(self, ids, n, max_tokens, seed, **_):
        return [Completion(self.tokens, [-0.1] * len(self.tokens), "stop")]


def _episode(call: str, tools: dict[str, ToolLike]) -> dict:
    return multi_turn(OneCall(call), TOK, TOK.encode("q"), tools=tools, max_turns=1, max_tokens=64, seed=0)


def search_html(_args: str) -> str:
    return json.loads("<html>502 Bad Gateway</html>")["results"][0]  # ValueError: the backend's page


def search_no_key(_args: str) -> str:
    return {"error": "rate limited"}["results"]  # KeyError: the backend's answer


def search_typed(q: str) -> str:
    return {"error": "rate limited"}["results"]


SEARCH = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"],
          "additionalProperties": False}


@pytest.mark.parametrize("tool", [search_html, search_no_key, Tool(search_typed, SEARCH)])
def test_a_backend_failing_on_valid_arguments_is_the_environments(tool: Callable[[str], str]) -> None:
    call = '<call>search({"q": "capital of France"})</call>'
    episode = _episode(call, {"search": tool})
    assert episode["finish_reason"] == "tool_failure", episode["messages"][-1]


@pytest.mark.parametrize(("args", "named"), [
    ("capital of France", "not JSON"), ('["x"]', "not a JSON object"), ('{"q": 3}', "3"),
    ('{"query": "x"}', "required"),
])
def test_arguments_failing_the_tools_check_are_the_models_and_the_tool_never_runs(args: str, named: str) -> None:
    ran = []

    def search(q: str) -> str:
        ran.append(q)
        return "Paris"

    episode = _episode(f"<call>search({args})</call>", {"search": Tool(search, SEARCH)})
    assert episode["finish_reason"] == "tool_misuse" and named in episode["messages"][-1]["content"]
    assert ran == []


def test_a_signature_that_does_not_bind_is_the_models() -> None:
    def search(q: str) -> str:
        return "Paris"

    episode = _episode('<call>search({"q": "x", "page": 2})</call>', {"search": Tool(search)})
    assert episode["finish_reason"] == "tool_misuse"


@pytest.mark.parametrize("expression", [
    "2+", "1//0", "x*2", "True+1", "2**3",
    "9" * 5000,  # a literal past int's digit limit (ValueError, not the calculator's own check)
    "1" + "0" * 100,  # at the value bound (10**100)
    "*".join(["9" * 30] * 6),  # an intermediate value past the bound
    "1+" * 100 + "1",  # one character over the length bound
    "(" * 150 + "1" + ")" * 150,  # deeper nesting than the length bound allows
    "1\x00",
])
def test_a_tools_explicit_refusal_is_the_models(expression: str) -> None:
    """Whatever the model writes, the calculator either answers or refuses (the model's); it never raises
    anything that passes for the environment's failure."""
    with pytest.raises(ToolArgumentError):
        calculator(expression)
    assert _episode(f"<call>calc({expression})</call>", {"calc": calculator})["finish_reason"] == "tool_misuse"


def test_an_unknown_tool_is_the_models() -> None:
    assert _episode("<call>browse(x)</call>", {"calc": calculator})["finish_reason"] == "tool_misuse"


@pytest.mark.parametrize(("expression", "value"), [("9" * 99, "9" * 99), ("-3*4", "-12"), ("(((1+2)))*5", "15"),
                                                   ("+".join(["1"] * 100), "100"),
                                                   ("(" * 99 + "1" + ")" * 99, "1")])
def test_the_calculator_answers_up_to_its_bounds(expression: str, value: str) -> None:
    assert calculator(expression) == value
