"""User patterns and the json_schema verifier answer as documented whatever the engine or the answer: RE2 reads a
"linear" pattern as ``re`` does, a linear pattern still has the component deadline, and a hostile wrong JSON
answer is a fail (0), never 'could not score'. (Each case reproduces an attack of the availability round.)"""

from __future__ import annotations

import random
import re
import time

import pytest

from reward_models import RewardSpec, Scorer
from reward_models.patterns import UserPattern
from tests.reward_models.helpers import make_prompt, make_sample

# ---------------------------------------------------------------------------------------------------
# 2. RE2 reads some "linear" patterns differently from re: the reward depends on the engine
# Attack: RE2 read some patterns classified linear ({,3}, [[:alpha:]], repeated captures) differently from re.


@pytest.mark.parametrize(
    ("pattern", "text"),
    [
        (r"<answer>[0-9]{,3}</answer>", "<answer>42</answer>"),  # re: {0,3}; RE2: the literal '{,3}'
        (r"[[:alpha:]]+", "abc"),  # RE2: POSIX class; re: the set '[:alph' then a literal ']'
        (r"[[:alpha:]]", "a]"),
        (r"(?P<answer>a*)*", "aa"),  # captures of a repeated group: re '' vs RE2 'aa'
    ],
)
def test_a_pattern_classified_linear_answers_exactly_as_re(pattern: str, text: str) -> None:
    ours, ref = UserPattern(pattern), re.compile(pattern, re.DOTALL)
    got, want = ours.fullmatch(text), ref.fullmatch(text)
    as_tuple = lambda m: None if m is None else (m.group(0), m.groups())  # noqa: E731
    assert as_tuple(got) == as_tuple(want), f"linear={ours.linear}: RE2 {as_tuple(got)} vs re {as_tuple(want)}"


# Attack: a rule.format reward changed with the regex engine for a documented {,3} repeat.
def test_format_reward_is_the_same_as_with_re_for_a_bounded_repeat() -> None:
    """The reward a spec author gets for the documented (re) reading of ``{,3}``."""
    spec = RewardSpec(
        name="fmt",
        components=[{"name": "fmt", "kind": "rule.format", "outcome": True,
                     "params": {"pattern": r"<answer>[0-9]{,3}</answer>", "match": "fullmatch"}}],
    )
    with Scorer(processes=1, timeout_s=5.0) as scorer:
        (scored,) = scorer.score(spec, [(make_sample("<answer>42</answer>"), make_prompt())])
    assert scored.components["fmt"].value == 1.0


# ---------------------------------------------------------------------------------------------------
# 3. an RE2 ("linear") pattern is still unbounded in practice and runs with no deadline

WIDE = "(?:" + "|".join(f"[a-q][^u-z]{{0,999}}{chr(0x4E00 + i)}" for i in range(50)) + ")+!"


# Attack: an RE2-linear pattern with wide counted repeats ran for tens of seconds inline with no deadline.
def test_a_linear_pattern_that_is_slow_in_practice_is_still_held_to_the_component_deadline() -> None:
    rule = UserPattern(WIDE)
    assert rule.linear  # accepted by RE2: scored inline, outside the pool
    random.seed(0)
    text = "".join(random.choice("ar") for _ in range(3000))
    spec = RewardSpec(
        name="wide",
        components=[{"name": "fmt", "kind": "rule.format", "outcome": True, "params": {"pattern": WIDE}}],
    )
    with Scorer(processes=1, timeout_s=2.0) as scorer:
        start = time.perf_counter()
        (scored,) = scorer.score(spec, [(make_sample(text), make_prompt())])
        elapsed = time.perf_counter() - start
    # with a 2 s deadline (plus a canary) scoring must end within a few seconds, as a fail
    assert elapsed < 8.0, f"one 3000-char answer held the scorer {elapsed:.1f}s with no deadline"
    assert scored.components["fmt"].value == 0.0


# ---------------------------------------------------------------------------------------------------
# 4. json_schema: a wrong answer can make the verifier raise (error = could not score = group dropped)

SCHEMA_SPEC = RewardSpec(
    name="schema",
    components=[{"name": "valid", "kind": "verifier.json_schema", "outcome": True,
                 "params": {"schema": {"type": "object", "required": ["a"]}, "extract": "whole"}}],
)


# Attack: a wrong answer with a huge integer or deep nesting made verifier.json_schema raise (group dropped) instead of fail.
@pytest.mark.parametrize(
    "answer",
    ['{"b": ' + "9" * 5000 + "}", "[" * 100000 + "]" * 100000, '{"a": NaN}', '{"a": -Infinity}', "NaN"],
    ids=["int-over-4300-digits", "nested-100k", "nan", "minus-infinity", "bare-nan"],
)
def test_a_wrong_json_answer_is_a_fail_not_an_error(answer: str) -> None:
    with Scorer(processes=1, timeout_s=5.0) as scorer:
        (scored,) = scorer.score(SCHEMA_SPEC, [(make_sample(answer), make_prompt({}))])
    result = scored.components["valid"]
    assert result.error is None, f"the answer turned its own fail into 'could not score': {result.error}"
    assert result.value == 0.0 and result.details["reason"] == "not_json"


# Attack: NaN compares false to everything, so a NaN answer passed minimum / maximum.
@pytest.mark.parametrize("answer", ['{"x": NaN}', '{"x": Infinity}', '{"x": 5}'])
def test_nan_never_passes_a_bound(answer: str) -> None:
    """NaN compares false to everything, so it would pass ``minimum``/``maximum``; it is not JSON."""
    schema = {"type": "object", "required": ["x"], "properties": {"x": {"type": "number", "minimum": 0, "maximum": 1}}}
    spec = RewardSpec(name="bound", components=[{"name": "v", "kind": "verifier.json_schema", "outcome": True,
                                                 "params": {"schema": schema, "extract": "whole"}}])
    with Scorer(processes=1, timeout_s=5.0) as scorer:
        (scored,) = scorer.score(spec, [(make_sample(answer), make_prompt({}))])
    assert scored.components["v"].error is None and scored.components["v"].value == 0.0
