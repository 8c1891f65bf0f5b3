"""Registry, reward specs and the weighted combination."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from reward_models import KINDS, ComponentResult, RewardSpec, combine, make_component
from reward_models.base import error_result

EXPECTED_KINDS = {
    "rule.format",
    "rule.tool_calls",
    "rule.repetition",
    "rule.length",
    "rule.overlong",
    "rule.turns",
    "verifier.math",
    "verifier.exact_match",
    "verifier.f1",
    "verifier.code",
    "verifier.json_schema",
    "judge.llm",
    "judge.reward_model",
    "external.reported",
    "python.function",
}


def spec(*components: dict) -> RewardSpec:
    return RewardSpec(name="s", components=list(components))


def ok(value: float) -> ComponentResult:
    return ComponentResult(value=value, details={})


def test_registry_has_exactly_the_design_kinds() -> None:
    assert set(KINDS) == EXPECTED_KINDS
    assert all(cls.kind == kind for kind, cls in KINDS.items())


def test_unknown_kind_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown kind 'rule.nope'; valid: external.reported, judge.llm, .*python.function, .*verifier.math"):
        make_component("rule.nope", {})


@pytest.mark.parametrize(
    ("kind", "params", "message"),
    [
        ("rule.overlong", {"max_tokens": 100, "buffer": 200}, "buffer must be <= max_tokens"),
        ("rule.overlong", {"max_tokens": 100}, "param 'buffer'"),
        ("rule.format", {"required_tags": ["answer"], "colour": "red"}, "param 'colour'"),
        ("rule.format", {"pattern": "("}, "param 'pattern'.*invalid regex"),
        ("rule.format", {}, "give required_tags or pattern"),
        ("verifier.json_schema", {"schema": {"type": "nonsense"}}, "param 'schema'.*invalid JSON schema"),
        ("judge.llm", {"endpoint": "", "model": "m"}, "param 'endpoint'"),
        ("judge.llm", {"base_url": "https://x", "model": "m"}, "base_url: judge URLs, keys and limits are deployment"),
        ("judge.reward_model", {}, "exactly one of model_path and config"),
        ("verifier.code", {"on_timeout": "retry"}, "param 'on_timeout'"),
    ],
)
def test_bad_params_name_the_param(kind: str, params: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_component(kind, params)


def test_spec_errors_name_the_field() -> None:
    cases = [
        ([], "components: at least one component"),
        (
            [{"name": "a", "kind": "rule.turns", "params": {"max_turns": 3}}, {"name": "b", "kind": "foo"}],
            r"components\[1\]\.kind: unknown kind 'foo'; valid: ",
        ),
        (
            [{"name": "a", "kind": "verifier.math"}, {"name": "a", "kind": "verifier.f1"}],
            r"components\[1\]\.name: duplicate name 'a'",
        ),
        (
            [
                {"name": "a", "kind": "verifier.math", "outcome": True},
                {"name": "b", "kind": "verifier.f1", "outcome": True},
            ],
            r"components\[1\]\.outcome: at most one",
        ),
        (
            [{"name": "a", "kind": "verifier.math", "weight": math.nan}],
            r"components\[0\]\.weight: must be finite",
        ),
        (
            [{"name": "a", "kind": "rule.overlong", "params": {"max_tokens": 10, "buffer": 20}}],
            r"components\[0\]\.params: rule.overlong: .*buffer must be <= max_tokens",
        ),
    ]
    for components, message in cases:
        with pytest.raises(ValidationError, match=message):
            RewardSpec(name="s", components=components)


def test_outcome_is_the_marked_one_else_the_first_verifier() -> None:
    fmt = {"name": "fmt", "kind": "rule.format", "params": {"required_tags": ["answer"]}}
    assert (
        spec(
            fmt, {"name": "em", "kind": "verifier.exact_match"}, {"name": "m", "kind": "verifier.math"}
        ).outcome_name()
        == "em"
    )
    assert (
        spec(
            fmt,
            {"name": "em", "kind": "verifier.exact_match"},
            {"name": "m", "kind": "verifier.math", "outcome": True},
        ).outcome_name()
        == "m"
    )
    assert spec(fmt).outcome_name() is None


def test_spec_round_trips_through_json() -> None:
    original = spec(
        {"name": "m", "kind": "verifier.math", "weight": 2.0, "outcome": True},
        {"name": "j", "kind": "verifier.json_schema", "params": {"schema": {"type": "object"}}},
    )
    again = RewardSpec.model_validate(original.model_dump(mode="json"))
    assert again == original


def test_reward_model_spec_validates_without_loading_a_model() -> None:
    component = make_component("judge.reward_model", {"model_path": "/nonexistent/model"})
    assert component._model is None  # construction validates params only; loading is lazy


def test_combine_is_the_weighted_sum_with_the_outcome() -> None:
    s = spec(
        {"name": "m", "kind": "verifier.math", "weight": 1.0},
        {"name": "fmt", "kind": "rule.format", "weight": 0.2, "params": {"required_tags": ["answer"]}},
        {"name": "long", "kind": "rule.overlong", "weight": 0.5, "params": {"max_tokens": 10, "buffer": 5}},
    )
    scored = combine(s, {"m": ok(1.0), "fmt": ok(0.0), "long": ok(-0.4)})
    assert scored.total == pytest.approx(1.0 * 1.0 + 0.2 * 0.0 + 0.5 * -0.4)
    assert scored.outcome == 1.0
    assert set(scored.components) == {"m", "fmt", "long"}


def test_combine_error_gives_no_total_never_zero() -> None:
    s = spec(
        {"name": "m", "kind": "verifier.math"},
        {"name": "t", "kind": "rule.turns", "params": {"max_turns": 4}},
    )
    scored = combine(s, {"m": error_result("timeout after 10s"), "t": ok(0.0)})
    assert scored.total is None
    assert scored.outcome is None
    assert scored.components["m"].error == "timeout after 10s"
    assert combine(s, {"m": ok(1.0)}).total is None  # a missing component is not a 0


@pytest.mark.parametrize(
    ("weights", "values", "blamed"),
    [
        ((2.0, 1.0), (1e308, 0.5), "a"),  # a term that would overflow
        ((1.0, 1.0), (1e308, 1e308), "ab"),  # finite terms whose partial sum would overflow
        ((2.0, -2.0), (1e308, 1e308), "ab"),  # +inf and -inf terms
        ((1e-3, 1e6), (1.0, 1e303), "b"),  # a value whose square overflows the statistics' sums
        ((1.0, 1.0), (-1e300, 0.5), "a"),
        ((1.0, 1.0), (1e6 * (1 + 1e-15), 0.5), "a"),  # just past the bound
    ],
)
def test_combine_a_value_beyond_the_range_of_a_reward_is_a_named_error(weights, values, blamed) -> None:
    """Every value beyond +-MAX_REWARD_MAGNITUDE (1e6) is an error naming the range (finite, but its weighted
    sum or its square in the reward statistics is not); with values and weights both bounded, no total can
    overflow any more, and the bound itself adds up."""
    s = spec({"name": "a", "kind": "external.reported", "weight": weights[0], "outcome": True},
             {"name": "b", "kind": "external.reported", "weight": weights[1], "params": {"key": "b"}})
    scored = combine(s, {"a": ok(values[0]), "b": ok(values[1])})
    assert scored.total is None
    for name, value in zip("ab", values, strict=True):
        got = scored.components[name]
        if name in blamed:
            assert got.value is None and got.error.startswith(f"value {value!r} outside [-1e+06, 1e+06]")
            assert got.details["value"] == value
        else:
            assert got.error is None and got.value == value
    assert scored.outcome == (None if "a" in blamed else values[0])
    top = combine(s, {"a": ok(1e6), "b": ok(-1e6)})
    assert top.total == pytest.approx(weights[0] * 1e6 - weights[1] * 1e6)


def test_component_result_value_xor_error() -> None:
    with pytest.raises(ValueError):
        ComponentResult(value=None, details={})
    with pytest.raises(ValueError):
        ComponentResult(value=1.0, details={}, error="boom")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_component_value_is_an_error_never_a_score(bad: float) -> None:
    s = spec({"name": "m", "kind": "verifier.math"}, {"name": "t", "kind": "rule.turns", "params": {"max_turns": 4}})
    scored = combine(s, {"m": ok(bad), "t": ok(1.0)})
    assert scored.total is None and scored.outcome is None
    assert scored.components["m"].value is None and "non-finite" in (scored.components["m"].error or "")
    assert scored.components["t"].value == 1.0
    assert combine(s, {"m": ok(0.0), "t": ok(1.0)}).total == pytest.approx(1.0)  # finite values untouched
