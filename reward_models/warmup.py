"""Imported by the KillablePool's forkserver (``preload``): runs math verification once so every
worker forked from it starts with math-verify's parsers built and sympy warm. A fresh worker (at
start, or replacing one killed at its deadline) then scores its first sample in milliseconds, not
the ~0.3 s of a cold first call."""

from reward_models.base import PromptInfo, Sample
from reward_models.verifiers import MathVerifier

MathVerifier().score(
    Sample([], r"The answer is $\boxed{\frac{1}{2}}$", "stop", 0, 1),
    PromptInfo([], {"answer": "0.5"}, {}, "warmup"),
)
