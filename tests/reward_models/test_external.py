"""external.reported and python.function: the value or an error, never a silent 0; the allowlist holds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from reward_models.external import PYTHON_FUNCTIONS_ENV, ExternalReported, PythonFunction
from reward_models.registry import make_component
from reward_models.spec import RewardSpec
from tests.reward_models.helpers import make_prompt, make_sample


@pytest.mark.parametrize("value", [0.0, -1.0, 1.0, 0.25, 3])
def test_reported_value_inside_bounds(value: float) -> None:
    c = ExternalReported({"key": "env_reward", "min": -1, "max": 3})
    r = c.score(make_sample(metadata={"env_reward": value}), make_prompt())
    assert (r.value, r.error) == (float(value), None)


@pytest.mark.parametrize(
    ("metadata", "needle"),
    [
        ({}, "no 'env_reward'"),
        ({"env_reward": None}, "expected a number"),
        ({"env_reward": "1.0"}, "expected a number"),
        ({"env_reward": True}, "expected a number"),  # bool is an int in Python; not a reward
        ({"env_reward": math.nan}, "not finite"),
        ({"env_reward": math.inf}, "not finite"),
        ({"env_reward": 3.0001}, "outside"),
        ({"env_reward": -1.5}, "outside"),
    ],
)
def test_reported_bad_values_are_errors(metadata: dict, needle: str) -> None:
    c = ExternalReported({"key": "env_reward", "min": -1, "max": 3})
    r = c.score(make_sample(metadata=metadata), make_prompt())
    assert r.value is None and needle in (r.error or "")


def test_reported_params_checked() -> None:
    with pytest.raises(ValueError, match="min must be <= max"):
        make_component("external.reported", {"min": 2, "max": 1})
    with pytest.raises(ValueError, match="param 'path'"):
        make_component("external.reported", {"path": "/etc/passwd"})


USER_FILE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "raise":
        raise RuntimeError("user bug")
    if solution_str == "nan":
        return float("nan")
    if solution_str == "dict":
        return {"score": 0.5, "acc": True, "note": "x", "bad": [1]}
    return float(solution_str.strip() == str(ground_truth)) + extra_info.get("bonus", 0.0)

def other(data_source, solution_str, ground_truth, extra_info=None):
    return len(data_source)
'''


@pytest.fixture
def user_functions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "my_reward.py"
    path.write_text(USER_FILE)
    monkeypatch.setenv(PYTHON_FUNCTIONS_ENV, json.dumps({"mine": str(path), "other": f"{path}:other"}))
    return path


def test_python_function_called_with_verls_arguments(user_functions: Path) -> None:
    c = PythonFunction({"name": "mine", "extra_info": {"bonus": 0.0}})
    assert c.score(make_sample("42"), make_prompt({"answer": "42"})).value == 1.0
    assert c.score(make_sample("41"), make_prompt({"answer": "42"})).value == 0.0
    assert c.score(make_sample("7"), make_prompt({"ground_truth": "7"})).value == 1.0
    bonus = c.score(make_sample("41"), make_prompt({"answer": "42"}, metadata={"bonus": 0.25}))
    assert bonus.value == 0.25
    d = c.score(make_sample("dict"), make_prompt())
    assert (d.value, d.details) == (0.5, {"acc": True, "note": "x"})
    o = PythonFunction({"name": "other"}).score(make_sample("x"), make_prompt(dataset="gsm8k"))
    assert o.value == 5.0


@pytest.mark.parametrize(("answer", "needle"), [("raise", "user bug"), ("nan", "not finite")])
def test_python_function_failures_are_errors(user_functions: Path, answer: str, needle: str) -> None:
    r = PythonFunction({"name": "mine"}).score(make_sample(answer), make_prompt())
    assert r.value is None and needle in (r.error or "")


def test_python_function_path_is_never_a_spec_param(user_functions: Path) -> None:
    with pytest.raises(ValueError, match="not an allowed function"):
        RewardSpec(name="s", components=[{"name": "f", "kind": "python.function", "params": {"name": "/etc/x"}}])
    with pytest.raises(ValueError, match="param 'path'"):
        make_component("python.function", {"name": "mine", "path": str(user_functions)})


def test_python_function_without_allowlist(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PYTHON_FUNCTIONS_ENV, raising=False)
    with pytest.raises(ValueError, match="none configured"):
        make_component("python.function", {"name": "mine"})


def test_python_function_allowlist_removed_after_validation(user_functions: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c = PythonFunction({"name": "mine"})
    monkeypatch.setenv(PYTHON_FUNCTIONS_ENV, "{}")
    r = c.score(make_sample("42"), make_prompt())
    assert r.value is None and "no longer an allowed" in (r.error or "")


def test_python_function_file_edited_is_reloaded(user_functions: Path) -> None:
    c = PythonFunction({"name": "mine"})
    assert c.score(make_sample("42"), make_prompt()).value == 1.0
    user_functions.write_text("def compute_score(**kw):\n    return -2\n")
    import os
    st = user_functions.stat()
    os.utime(user_functions, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert c.score(make_sample("42"), make_prompt()).value == -2.0
