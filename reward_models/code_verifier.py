"""``verifier.code``: run the trajectory's program in a sandbox against the prompt's reference.

The program is the last fenced python block of the final answer, else the whole final answer.
The reference gives either ``tests`` (Python source: ``check(candidate)`` and / or top-level asserts
calling the program's functions; ``entry_point`` names the candidate) or ``io`` (a list of
``{"input", "output"}`` stdin / stdout cases); ``prompt`` (optional, HumanEval's field) is the
prompt's code, trusted: its helpers (``encode_shift``, ``poly``) are the ones the tests call, so a
program cannot rig them by redefining them. ``mode: "harness"`` (the default) runs the tests in a
harness sandbox and the program in a program sandbox, the pool worker brokering between them
(``reward_models.code_harness``); ``mode: "trusted_tests_in_process"`` runs both in the program's
interpreter, where a program can forge its own pass: use it only for tests that need the program's
objects themselves. The reference is trusted to decide the verdict, never with the host: no code
of it runs outside a sandbox.

Pass (1.0) / fail (0.0) come from the supervisor's own observations; a sandbox that cannot start, no
acceptable backend, or a reference that fails on its own is an error (never a 0); anything the
program causes is a 0. Runs in the Scorer's KillablePool (``cpu_heavy``): each pool worker keeps warm
sandboxes, and its canary (``canary``) tells a slow answer from a sick verifier.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, model_validator

from reward_models.base import ComponentError, ParamsModel, PromptInfo, RewardComponent, Sample, canary_item
from reward_models.code_harness import (
    Outcome,
    ReferenceProblem,
    run_function_tests,
    run_in_process,
    run_io_tests,
)
from reward_models.sandbox import SandboxLimits, checkout
from reward_models.sandbox_backend import SandboxError
from reward_models.sandbox_settings import DEPLOYMENT_ONLY, get_sandbox_settings
from reward_models.text import extract_code

_STARTUP_SLACK_S = 15.0


class CodeParams(ParamsModel):
    mode: Literal["harness", "trusted_tests_in_process"] = "harness"
    timeout_s: float = Field(default=5.0, gt=0.0, le=600.0)
    memory_mb: int = Field(default=512, ge=64, le=65536)
    max_processes: int = Field(default=32, ge=1, le=4096)
    max_file_mb: int = Field(default=16, ge=1, le=4096)
    max_output_bytes: int = Field(default=4096, ge=0, le=16384)
    on_timeout: Literal["fail", "error"] = "fail"

    @model_validator(mode="before")
    @classmethod
    def _no_weakening(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in sorted(DEPLOYMENT_ONLY & set(data)):
                env = f"GRPO_CURATOR_SANDBOX_{key.upper()}"
                raise ValueError(
                    f"param '{key}' weakens or selects the sandbox: it is a deployment setting ({env}), "
                    "not a reward-spec param"
                )
        return data


def _io_cases(io: Any) -> list[tuple[str, str]]:
    if not isinstance(io, list) or not io:
        raise ComponentError("reference.io must be a non-empty list of {input, output}")
    cases = []
    for i, case in enumerate(io):
        if (
            not isinstance(case, dict)
            or not isinstance(case.get("input"), str)
            or not isinstance(case.get("output"), str)
        ):
            raise ComponentError(f'reference.io[{i}] must be {{"input": str, "output": str}}')
        cases.append((case["input"], case["output"]))
    return cases


class CodeVerifier(RewardComponent):
    """1.0 when the program passes the reference's tests or io cases in the sandbox, else 0.0.

    ``on_timeout="error"`` records a time-out as "could not decide" instead of a fail (useful when
    the machine is overloaded and correct programs may be slow).
    """

    kind = "verifier.code"
    cpu_heavy = True
    reference_fields = ("tests",)

    @staticmethod
    def reference_problem(reference: Mapping[str, Any]) -> tuple[str, str] | None:
        tests = reference.get("tests")
        if not isinstance(tests, str) or not tests.strip():
            return "tests", "must be non-empty Python source (a string)"
        return None
    Params = CodeParams

    def canary(self) -> tuple[Sample, PromptInfo]:
        """A correct program for a one-line test: passes within the deadline on a healthy verifier."""
        return canary_item("def canary(x):\n    return x + 1\n", {"tests": "assert canary(1) == 2\n"})

    def deadline_s(self) -> float:
        """The pool's limit for one sample: the program's time plus sandbox start-up."""
        return self.params.timeout_s + _STARTUP_SLACK_S

    def _limits(self) -> SandboxLimits:
        p = self.params
        return SandboxLimits(
            timeout_s=p.timeout_s,
            memory_mb=p.memory_mb,
            max_processes=p.max_processes,
            max_file_mb=p.max_file_mb,
            max_output_bytes=p.max_output_bytes,
        )

    def _run(self, source: str, reference: dict) -> tuple[Outcome, str, str]:
        """(outcome, backend name, mode actually used)."""
        tests, io, entry = reference.get("tests"), reference.get("io"), reference.get("entry_point")
        if entry is not None and not (isinstance(entry, str) and entry.isidentifier()):
            raise ComponentError("reference.entry_point must be a Python identifier")
        helpers = reference.get("prompt")
        if helpers is not None and not isinstance(helpers, str):
            raise ComponentError("reference.prompt must be Python source (the prompt's code)")
        if not isinstance(tests, str) and io is None:
            raise ComponentError("prompt reference has no 'tests' (Python source) and no 'io' cases")
        cases = _io_cases(io) if not isinstance(tests, str) else None
        limits = self._limits()
        mode = "io" if cases is not None else self.params.mode
        settings = get_sandbox_settings()
        with checkout(settings) as sandbox:
            if cases is not None:
                outcome = run_io_tests(sandbox, limits, source, cases)
            else:
                assert isinstance(tests, str)  # no io cases only where the tests are Python source (checked above)
                if mode == "trusted_tests_in_process":
                    outcome = run_in_process(sandbox, limits, source, tests)
                else:
                    with checkout(settings, role="harness") as harness:  # started before the clock runs
                        outcome = run_function_tests(sandbox, limits, source, tests, entry, helpers, harness)
            return outcome, sandbox.backend.name, mode

    def evaluate(self, sample: Sample, prompt: PromptInfo) -> tuple[float, dict]:
        start = time.perf_counter()
        try:
            outcome, isolation, mode = self._run(extract_code(sample.final_answer), prompt.reference)
        except ReferenceProblem as exc:
            raise ComponentError(f"reference: {exc}") from None
        except SandboxError as exc:
            raise ComponentError(f"sandbox error: {exc}") from None
        details = {
            "verdict": outcome.verdict,
            "reason": outcome.reason,
            "calls": outcome.calls,
            "exit": outcome.exit,
            "output": outcome.output,
            "isolation": isolation,
            "mode": mode,
            "wall_ms": round((time.perf_counter() - start) * 1000.0, 1),
            **outcome.extra,
        }
        if outcome.verdict == "timeout" and self.params.on_timeout == "error":
            raise ComponentError(f"timeout after {self.params.timeout_s}s", details)
        return float(outcome.verdict == "passed"), details
