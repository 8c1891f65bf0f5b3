"""Curation policy: defaults, merging, validation of the dataclasses and the API schema."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from filters.policy import CurationPolicySpec
from filters.types import (
    DEFAULT_FINISH_REASON_ACTIONS,
    FINISH_REASONS,
    AdvantageConfig,
    CurationPolicy,
    CurriculumConfig,
    ZeroVariance,
)


def error_locs(exc: pytest.ExceptionInfo[ValidationError]) -> list[tuple]:
    return [tuple(e["loc"]) for e in exc.value.errors()]


def test_the_old_name_tool_error_reads_as_tool_failure_and_a_contradiction_is_refused() -> None:
    spec = CurationPolicySpec.model_validate({"name": "p", "finish_reason_actions": {"tool_error": "resample"}})
    assert spec.to_policy().finish_reason_actions["tool_failure"] == "resample"
    for actions in ({"tool_error": "drop", "tool_failure": "resample"}, {"tool_failure": "resample", "tool_error": "drop"}):
        # either order names the old name as the old one
        with pytest.raises(ValidationError, match="'tool_error' is the old name of 'tool_failure'"):
            CurationPolicySpec.model_validate({"name": "p", "finish_reason_actions": actions})
    assert CurationPolicy(finish_reason_actions={"tool_error": "resample"}).finish_reason_actions[
        "tool_failure"] == "resample"


class TestCurationPolicy:
    def test_defaults(self) -> None:
        policy = CurationPolicy()
        assert dict(policy.finish_reason_actions) == {
            "stop": "keep",
            "length": "mask",
            "max_turns": "mask",
            "tool_misuse": "keep",
            "tool_failure": "drop",
            "env_error": "drop",
            "timeout": "drop",
            "aborted": "drop",
        }
        assert set(DEFAULT_FINISH_REASON_ACTIONS) == set(FINISH_REASONS)
        assert (policy.zero_variance.metric, policy.zero_variance.action) == ("outcome", "drop")
        assert (policy.advantage.estimator, policy.advantage.std) == ("grpo", "population")
        assert (policy.max_staleness, policy.min_group_size, policy.penalty) == (None, 2, -1.0)

    def test_overrides_merge_with_defaults(self) -> None:
        policy = CurationPolicy(finish_reason_actions={"length": "penalize", "timeout": "resample"})
        assert policy.finish_reason_actions["length"] == "penalize"
        assert policy.finish_reason_actions["timeout"] == "resample"
        assert policy.finish_reason_actions["max_turns"] == "mask"
        with pytest.raises(TypeError):
            policy.finish_reason_actions["stop"] = "drop"  # type: ignore[index]

    @pytest.mark.parametrize(
        ("make", "message"),
        [
            (lambda: CurationPolicy(finish_reason_actions={"oom": "drop"}), "valid: stop, length"),
            (lambda: CurationPolicy(finish_reason_actions={"length": "ignore"}), "valid: keep, drop, mask"),
            (lambda: CurationPolicy(min_group_size=0), "min_group_size"),
            (lambda: CurationPolicy(max_staleness=-1), "max_staleness"),
            (lambda: CurationPolicy(overlong_buffer=1.5), "overlong_buffer"),
            (lambda: CurationPolicy(resample_budget_multiplier=0.5), "resample_budget_multiplier"),
            (lambda: CurationPolicy(reward_error="zero"), "valid: drop, drop_group"),  # type: ignore[arg-type]
            (lambda: ZeroVariance(action="mask"), "valid: drop, keep"),  # type: ignore[arg-type]
            (lambda: ZeroVariance(eps=-1.0), "eps"),
            (lambda: ZeroVariance(pass_rate_band=(0.8, 0.2)), "low <= high"),
            (lambda: AdvantageConfig(std="sample"), "valid: population, unbiased"),  # type: ignore[arg-type]
            (lambda: CurriculumConfig(k=0), "k"),
            (lambda: CurriculumConfig(solved=0.0, failed=0.5), "failed < solved"),
        ],
    )
    def test_invalid_raises_value_error(self, make, message: str) -> None:  # noqa: ANN001
        with pytest.raises(ValueError, match=message):
            make()


class TestCurationPolicySpec:
    def test_wire_example_to_policy(self) -> None:
        spec = CurationPolicySpec.model_validate(
            {
                "name": "math-v1",
                "zero_variance": {
                    "metric": "total",
                    "eps": 1e-4,
                    "action": "keep",
                    "pass_rate_band": [0.1, 0.9],
                },
                "finish_reason_actions": {"length": "penalize"},
                "max_staleness": 2,
                "min_group_size": 4,
                "advantage": {"estimator": "rloo", "std": "unbiased", "eps": 0.0},
                "overlong_buffer": 512,
            }
        )
        policy = spec.to_policy()
        assert policy.zero_variance == ZeroVariance("total", 1e-4, "keep", (0.1, 0.9))
        assert policy.finish_reason_actions["length"] == "penalize"
        assert policy.finish_reason_actions["tool_failure"] == "drop"
        assert (policy.max_staleness, policy.min_group_size, policy.overlong_buffer) == (2, 4, 512)
        assert policy.advantage == AdvantageConfig("rloo", "unbiased", 0.0)

    def test_minimal_body_gives_defaults(self) -> None:
        assert CurationPolicySpec(name="p").to_policy() == CurationPolicy()

    def test_round_trip(self) -> None:
        policy = CurationPolicy(
            max_staleness=3, finish_reason_actions={"aborted": "resample"}, penalty=-0.5, soft_overlong=True
        )
        spec = CurationPolicySpec.from_policy("p2", policy)
        assert CurationPolicySpec.model_validate(spec.model_dump(mode="json")).to_policy() == policy

    @pytest.mark.parametrize(
        ("body", "loc"),
        [
            ({"name": ""}, ("name",)),
            ({"name": "a@1"}, ("name",)),
            ({"name": "p", "zero_variance": {"action": "mask"}}, ("zero_variance", "action")),
            ({"name": "p", "zero_variance": {"eps": -1}}, ("zero_variance", "eps")),
            (
                {"name": "p", "zero_variance": {"pass_rate_band": [0.9, 0.1]}},
                ("zero_variance", "pass_rate_band"),
            ),
            (
                {"name": "p", "finish_reason_actions": {"oom": "drop"}},
                ("finish_reason_actions", "oom", "[key]"),
            ),
            ({"name": "p", "finish_reason_actions": {"length": "x"}}, ("finish_reason_actions", "length")),
            ({"name": "p", "advantage": {"estimator": "ppo"}}, ("advantage", "estimator")),
            ({"name": "p", "advantage": {"eps": float("nan")}}, ("advantage", "eps")),
            ({"name": "p", "min_group_size": 0}, ("min_group_size",)),
            ({"name": "p", "max_staleness": -2}, ("max_staleness",)),
            ({"name": "p", "overlong_buffer": 2.5}, ("overlong_buffer",)),
            ({"name": "p", "resample_budget_multiplier": 0.5}, ("resample_budget_multiplier",)),
            ({"name": "p", "curriculum": {"solved": 0.0}}, ("curriculum",)),
            ({"name": "p", "zero_varianse": {}}, ("zero_varianse",)),
            ({"name": "p", "soft_overlong": "yes"}, ("soft_overlong",)),
            ({"name": "p", "soft_overlong": 1}, ("soft_overlong",)),
        ],
    )
    def test_errors_name_the_field(self, body: dict, loc: tuple) -> None:
        with pytest.raises(ValidationError) as exc:
            CurationPolicySpec.model_validate(body)
        assert loc in error_locs(exc)
