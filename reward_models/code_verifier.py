"""``verifier.code``: run the trajectory's code followed by the prompt's unit tests in the sandbox.

The code is the last fenced python block of the final answer, else the whole final answer; the
tests are ``reference["tests"]`` (Python source). Pass (1.0) means the tests ran to the end and
the process exited 0 within its limits; anything else the program did is a fail (0.0). A sandbox
that could not run is an error. The sandboxed subprocess is itself the killable unit (its whole
process tree is SIGKILLed at the deadline), so this component runs in threads, not in the pool.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from pydantic import Field

from reward_models.base import (
    ComponentError,
    ComponentResult,
    ParamsModel,
    PromptInfo,
    RewardComponent,
    Sample,
)
from reward_models.sandbox import SandboxError, SandboxLimits, run_python
from reward_models.text import extract_code


class CodeParams(ParamsModel):
    timeout_s: float = Field(default=5.0, gt=0.0, le=600.0)
    memory_mb: int = Field(default=512, ge=64)
    max_processes: int = Field(default=32, ge=1)
    max_output_bytes: int = Field(default=4096, ge=0)
    allow_network: bool = False
    allow_subprocess: bool = False
    on_timeout: Literal["fail", "error"] = "fail"
    max_parallel: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1)


class CodeVerifier(RewardComponent):
    """1.0 when the code passes ``reference["tests"]`` in the sandbox, else 0.0.

    ``on_timeout="error"`` records a time-out as "could not decide" instead of a fail (useful when
    the machine is overloaded and correct programs may be slow).
    """

    kind = "verifier.code"
    reference_fields = ("tests",)

    @staticmethod
    def reference_problem(reference: Mapping[str, Any]) -> tuple[str, str] | None:
        tests = reference.get("tests")
        if not isinstance(tests, str) or not tests.strip():
            return "tests", "must be non-empty Python source (a string)"
        return None
    Params = CodeParams

    def _limits(self) -> SandboxLimits:
        p = self.params
        return SandboxLimits(
            timeout_s=p.timeout_s,
            memory_mb=p.memory_mb,
            max_processes=p.max_processes,
            max_output_bytes=p.max_output_bytes,
            allow_network=p.allow_network,
            allow_subprocess=p.allow_subprocess,
        )

    def evaluate(self, sample: Sample, prompt: PromptInfo) -> tuple[float, dict]:
        tests = prompt.reference.get("tests")
        if not isinstance(tests, str):
            raise ComponentError("prompt reference has no 'tests' (Python source)")
        try:
            result = run_python(extract_code(sample.final_answer), tests, self._limits())
        except SandboxError as exc:
            raise ComponentError(f"sandbox error: {exc}") from None
        details = result.details()
        if result.verdict == "timeout" and self.params.on_timeout == "error":
            raise ComponentError(f"timeout after {self.params.timeout_s}s", details)
        return float(result.verdict == "passed"), details

    def score_batch(self, items: list[tuple[Sample, PromptInfo]]) -> list[ComponentResult]:
        """Run up to ``max_parallel`` sandboxes at once (threads; each waits on its subprocess)."""
        if len(items) <= 1:
            return [self.score(s, p) for s, p in items]
        with ThreadPoolExecutor(max_workers=min(self.params.max_parallel, len(items))) as pool:
            return list(pool.map(lambda item: self.score(*item), items))
