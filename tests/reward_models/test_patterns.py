"""User regexes: RE2 where it answers exactly as ``re`` does, else the killable pool; ReDoS never hangs."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reward_models import RewardSpec, Scorer
from reward_models.patterns import UserPattern
from reward_models.registry import make_component
from tests.reward_models.helpers import make_prompt, make_sample

EVIL = "a" * 40 + "!"  # (a+)+ then a mismatch: 2**40 backtracking paths for re
LINEAR = [r"<answer>(.*?)</answer>", r"(?P<answer>[0-9]+)", r"^Answer: ([A-D])", r"(?:a+)+b", r"x|y+", r"[^<]*</t>"]
NOT_LINEAR = [r"^(a+)+$", r"(\d+)", r"(a)\1", r"a(?=b)", r"\w+", r"(?i)k", r"(?<!x)y", r"a\Z", r"(?>a+)b",
              r"(a+)+b", r"x|y*", r"", r"[0-9]{,3}", r"[[:alpha:]]+", r"(?P<answer>a*)*", r"(?:a|)+b", r"a++b"]


@pytest.mark.parametrize("pattern", LINEAR)
def test_linear_patterns_run_on_re2(pattern: str) -> None:
    assert UserPattern(pattern).linear


@pytest.mark.parametrize("pattern", NOT_LINEAR)
def test_patterns_re2_reads_differently_stay_on_re(pattern: str) -> None:
    assert not UserPattern(pattern).linear


def _spans(matches) -> list:
    return [(m.span(), m.groups()) for m in matches]


@settings(max_examples=300, deadline=None)
@given(
    pattern=st.sampled_from(LINEAR),
    text=st.text(alphabet="ab!<>/tanswer:AD0123xy\n é", max_size=30),
)
def test_re2_answers_exactly_as_re(pattern: str, text: str) -> None:
    """Slow and obvious beside fast: Python's re (DOTALL) is the reference for every linear pattern."""
    ours, ref = UserPattern(pattern), re.compile(pattern, re.DOTALL)
    assert _spans([ours.search(text)] if ours.search(text) else []) == _spans([ref.search(text)] if ref.search(text) else [])
    assert bool(ours.fullmatch(text)) == bool(ref.fullmatch(text))
    assert _spans(ours.finditer(text)) == _spans(ref.finditer(text))
    assert (ours.groups, ours.groupindex) == (ref.groups, dict(ref.groupindex))


def test_invalid_patterns_are_rejected_with_the_reason() -> None:
    with pytest.raises(ValueError, match="invalid regex"):
        UserPattern("(unclosed")
    with pytest.raises(ValueError, match="param 'pattern': invalid regex"):
        make_component("rule.format", {"pattern": "(unclosed"})


def test_a_linear_redos_pattern_is_scored_inline_in_linear_time() -> None:
    rule = make_component("rule.format", {"pattern": r"(?:a+)+b"})
    assert not rule.cpu_heavy
    start = time.perf_counter()
    result = rule.score(make_sample(EVIL * 1000), make_prompt())
    assert result.value == 0.0 and time.perf_counter() - start < 5  # behavioural bound: re would take hours


@pytest.mark.parametrize(
    "component",
    [
        {"kind": "rule.format", "params": {"pattern": r"^(a+)+$"}},
        {"kind": "verifier.exact_match", "params": {"extract_pattern": r"^(a+)+$"}},
        {"kind": "verifier.json_schema", "params": {"schema": {"type": "string", "pattern": "^(a+)+$"}}},
    ],
)
def test_a_backtracking_pattern_runs_under_the_deadline_and_fails_the_answer(component: dict) -> None:
    spec = RewardSpec(
        name="redos",
        components=[
            {"name": "c", "outcome": True, **component},
            {"name": "len", "kind": "rule.length", "weight": 0.0, "params": {"target": 1, "limit": 2}},
        ],
    )
    assert make_component(component["kind"], component["params"]).cpu_heavy
    answers = [f'"{EVIL}"' if component["kind"] == "verifier.json_schema" else EVIL, '"aaaa"', "aaaa"]
    items = [(make_sample(a), make_prompt({"answer": "aaaa"})) for a in answers]
    with Scorer(processes=1, timeout_s=1.0) as scorer:
        evil, *siblings = scorer.score(spec, items)
    c = evil.components["c"]
    assert (c.value, c.details["reason"]) == (0.0, "verification_timeout")
    assert evil.outcome == 0.0
    assert all(s.components["c"].error is None for s in siblings)
    assert max(s.outcome for s in siblings) == 1.0  # the matching sibling still passes


@pytest.mark.parametrize(
    ("kind", "params"),
    [
        ("verifier.math", {}),
        ("verifier.json_schema", {}),
        ("verifier.exact_match", {"extract_pattern": r"(\d+)"}),
        ("verifier.f1", {}),
        ("rule.format", {"pattern": r"^(a+)+$"}),
        ("rule.format", {"required_tags": ["answer"]}),
    ],
)
def test_every_pool_component_verifies_its_own_canary(kind: str, params: dict) -> None:
    """A canary that errors would turn every timeout of that component into an error (never a fail)."""
    component = make_component(kind, params)
    result = component.score(*component.canary())
    assert result.error is None and result.value is not None


# generated patterns: the allow-list's promise (RE2 == re) on patterns nobody picked by hand
_ATOMS = st.sampled_from(["a", "b", "<", ".", r"\.", "[ab]", "[^a]", "[a-c]", r"\d", r"\s", "$", "^", r"\b", r"\A", "é"])


def _combine(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    quantifiers = st.sampled_from(["*", "+", "?", "*?", "+?", "{2}", "{1,3}", "{,2}", "{2,}", "{0,1}?"])
    return st.one_of(
        st.tuples(inner, inner).map("".join),
        st.tuples(inner, inner).map(lambda t: f"(?:{t[0]}|{t[1]})"),
        st.tuples(inner, inner).map(lambda t: f"{t[0]}|{t[1]}"),
        inner.map(lambda x: f"({x})"),
        inner.map(lambda x: f"(?P<answer>{x})"),
        st.tuples(inner, quantifiers).map(lambda t: f"(?:{t[0]}){t[1]}"),
        st.tuples(inner, quantifiers).map(lambda t: f"({t[0]}){t[1]}"),
    )


PATTERNS = st.recursive(_ATOMS, _combine, max_leaves=8)


@settings(max_examples=400, deadline=None)
@given(pattern=PATTERNS, texts=st.lists(st.text(alphabet="ab<.c1 \né", max_size=12), min_size=1, max_size=4))
def test_generated_patterns_re2_accepts_answer_exactly_as_re(pattern: str, texts: list[str]) -> None:
    try:
        ours = UserPattern(pattern)
    except ValueError:
        return
    if not ours.linear:
        return
    ref = re.compile(pattern, re.DOTALL)
    as_tuple = lambda m: None if m is None else (m.span(), m.groups())  # noqa: E731
    for text in texts:
        assert as_tuple(ours.search(text)) == as_tuple(ref.search(text)), (pattern, text)
        assert as_tuple(ours.fullmatch(text)) == as_tuple(ref.fullmatch(text)), (pattern, text)
        assert _spans(ours.finditer(text)) == _spans(ref.finditer(text)), (pattern, text)


def test_program_size_and_text_length_bound_the_inline_path() -> None:
    small = UserPattern(r"<answer>([0-9]+)</answer>")
    assert small.inline_pattern and small.inline_ok("x" * 1000)
    assert not small.inline_ok("x" * (2_000_000 // small.program_size + 1))  # too long: the pool
    assert not small.inline_ok("\ud800")  # RE2 cannot take a lone surrogate: the pool (and re)
    assert small.search("\ud800<answer>1</answer>").group(1) == "1"
    wide = UserPattern("(?:[a-q][^u-z]{0,999}X)+!")
    assert wide.linear and not wide.inline_pattern  # a big program: always the pool
    assert make_component("rule.format", {"pattern": wide.pattern}).cpu_heavy


def test_each_answer_is_routed_by_its_own_cost_and_gets_the_reward_re_would_give() -> None:
    pattern = r"<answer>(?P<answer>[0-9]+)</answer>"
    rule = make_component("rule.format", {"pattern": pattern})
    long = "x" * (2_000_000 // UserPattern(pattern).program_size + 10) + "<answer>7</answer>"
    items = [(make_sample("<answer>7</answer>"), make_prompt()), (make_sample(long), make_prompt()),
             (make_sample("x" * len(long)), make_prompt())]
    assert [rule.in_pool(*item) for item in items] == [False, True, True]
    spec = RewardSpec(name="f", components=[{"name": "f", "kind": "rule.format", "outcome": True,
                                             "params": {"pattern": pattern}}])
    with Scorer(processes=1, timeout_s=10.0) as scorer:
        scored = scorer.score(spec, items)
    assert [s.components["f"].value for s in scored] == [1.0, 1.0, 0.0]
