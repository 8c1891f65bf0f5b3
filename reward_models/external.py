"""Components whose value comes from outside the registry: a producer-reported value, a user's function.

- ``external.reported``: the value an environment computed (an agent framework's own reward), read from
  the trajectory's ``metadata[key]`` and validated (a real number, finite, inside optional bounds).
- ``python.function``: a verl-style ``compute_score(data_source, solution_str, ground_truth, extra_info)``
  from a file the deployment allows. The spec names an entry of the allowlist, never a path: the list is
  deployment configuration (env ``GRPO_CURATOR_PYTHON_FUNCTIONS``, a JSON object ``{"name":
  "/path/file.py"}`` or ``{"name": "/path/file.py:function"}``). The component is ``cpu_heavy``, so the
  Scorer runs it in the killable process pool with the component deadline.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import numbers
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from reward_models.base import ComponentError, ParamsModel, PromptInfo, RewardComponent, Sample

PYTHON_FUNCTIONS_ENV = "GRPO_CURATOR_PYTHON_FUNCTIONS"


def finite_number(value: Any, what: str) -> float:
    """``value`` as a finite float: any real number, numpy's included (np.float32, np.int64: what verl-style
    functions often return); ComponentError for bools (numpy's too), strings, None, NaN and infinities."""
    if _is_bool(value) or not isinstance(value, numbers.Real):
        raise ComponentError(f"{what}: expected a number, got {type(value).__name__}")
    out = float(value)
    if not math.isfinite(out):
        raise ComponentError(f"{what}: not finite ({out})")
    return out


class ReportedParams(ParamsModel):
    key: str = Field(default="reward", min_length=1, max_length=200)
    min: float | None = Field(default=None, allow_inf_nan=False)
    max: float | None = Field(default=None, allow_inf_nan=False)

    @model_validator(mode="after")
    def _order(self) -> ReportedParams:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError("min must be <= max")
        return self


class ExternalReported(RewardComponent):
    """The producer's own value ``sample.metadata[key]``: missing, non-numeric, non-finite or out of
    ``[min, max]`` is an error (never clipped, never 0)."""

    kind = "external.reported"
    Params = ReportedParams

    def evaluate(self, sample: Sample, prompt: PromptInfo) -> tuple[float, dict]:
        key = self.params.key
        if key not in sample.metadata:
            raise ComponentError(f"trajectory metadata has no {key!r}")
        value = finite_number(sample.metadata[key], f"metadata.{key}")
        lo, hi = self.params.min, self.params.max
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise ComponentError(f"metadata.{key}: {value} outside [{lo}, {hi}]", {"reported": value})
        return value, {"key": key}


def allowed_functions() -> dict[str, tuple[Path, str]]:
    """The deployment's allowlist: name -> (file, function name). Read from the environment each call."""
    raw = os.environ.get(PYTHON_FUNCTIONS_ENV, "").strip()
    if not raw:
        return {}
    try:
        table = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{PYTHON_FUNCTIONS_ENV}: not a JSON object ({exc})") from None
    if not isinstance(table, dict):
        raise ValueError(f"{PYTHON_FUNCTIONS_ENV}: expected a JSON object of name -> path")
    out = {}
    for name, target in table.items():
        path, _, func = str(target).partition(":")
        out[str(name)] = (Path(path), func or "compute_score")
    return out


@functools.lru_cache(maxsize=32)
def _load(path: Path, func: str, mtime_ns: int) -> Callable[..., Any]:
    module_spec = importlib.util.spec_from_file_location(f"grpo_curator_user_{abs(hash(path))}", path)
    if module_spec is None or module_spec.loader is None:
        raise ComponentError(f"cannot load {path}")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    fn = getattr(module, func, None)
    if not callable(fn):
        raise ComponentError(f"{path} defines no function {func!r}")
    return fn


class FunctionParams(ParamsModel):
    name: str = Field(min_length=1, max_length=200)
    extra_info: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _allowed(self) -> FunctionParams:
        table = allowed_functions()
        if self.name not in table:
            valid = ", ".join(sorted(table)) or f"none configured ({PYTHON_FUNCTIONS_ENV})"
            raise ValueError(f"name: {self.name!r} is not an allowed function; valid: {valid}")
        return self


class PythonFunction(RewardComponent):
    """A user's ``compute_score`` called with verl's arguments: ``data_source`` = the prompt's dataset,
    ``solution_str`` = the final answer, ``ground_truth`` = ``reference.answer`` (else
    ``reference.ground_truth``), ``extra_info`` = params.extra_info + prompt metadata. It may return a
    number or a dict with ``score`` (its other numeric keys become details). A raise is an error."""

    kind = "python.function"
    cpu_heavy = True
    Params = FunctionParams

    def evaluate(self, sample: Sample, prompt: PromptInfo) -> tuple[float, dict]:
        entry = allowed_functions().get(self.params.name)
        if entry is None:  # the allowlist changed since the spec was validated
            raise ComponentError(f"{self.params.name!r} is no longer an allowed function")
        path, func = entry
        try:
            mtime = path.stat().st_mtime_ns
        except OSError as exc:
            raise ComponentError(f"{path}: {exc.strerror}") from None
        fn = _load(path, func, mtime)
        ref = prompt.reference
        ground_truth = ref.get("answer", ref.get("ground_truth"))
        extra = {**self.params.extra_info, **prompt.metadata}
        out = fn(data_source=prompt.dataset, solution_str=sample.final_answer, ground_truth=ground_truth,
                 extra_info=extra)
        if isinstance(out, dict):
            if "score" not in out:
                raise ComponentError("compute_score returned a dict without 'score'")
            plain = ((str(k)[:100], _plain(v)) for k, v in list(out.items())[:32] if k != "score")
            details = {k: v for k, v in plain if v is not None}
            return finite_number(out["score"], "compute_score()['score']"), details
        return finite_number(out, "compute_score()"), {}


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool) or type(value).__name__ in ("bool", "bool_")  # numpy's bool too


def _plain(value: Any) -> str | bool | int | float | None:
    """A detail value as plain JSON (strings cut at 1000 chars, numpy numbers as Python ones), else None."""
    if isinstance(value, str):
        return value[:1000]
    if _is_bool(value):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real) and math.isfinite(float(value)):
        return float(value)
    return None
