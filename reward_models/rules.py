"""Rule components over one trajectory: answer format, length, DAPO soft overlong, turn budget.

Values: ``rule.format`` is 1.0 / 0.0; the penalties are in [-1, 0] (0 = no penalty).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from filters.overlong import soft_overlong_penalty
from reward_models.base import ComponentError, ParamsModel, PromptInfo, RewardComponent, Sample
from reward_models.patterns import UserPattern
from reward_models.tags import THINK_TAG, answer_region, fold
from reward_models.text import assistant_text

_TAG_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")


def response_length(sample: Sample, unit: Literal["tokens", "chars", "words"]) -> int:
    """Length of the model's response in ``unit``; tokens come from ``sample.num_tokens``.

    A non-empty response with ``num_tokens == 0`` means "unknown" and raises ComponentError.
    """
    text = assistant_text(sample)
    if unit == "chars":
        return len(text)
    if unit == "words":
        return len(text.split())
    if sample.num_tokens <= 0 and text:
        raise ComponentError("num_tokens unknown (0) for a non-empty response")
    return max(sample.num_tokens, 0)


class FormatParams(ParamsModel):
    required_tags: list[str] = Field(default_factory=list)
    ordered: bool = True
    pattern: str | None = None
    match: Literal["search", "fullmatch"] = "search"
    nonempty: bool = True
    source: Literal["final_answer", "response"] = "final_answer"
    think_tag: str | None = Field(default=THINK_TAG, pattern=r"^[A-Za-z_][A-Za-z0-9_\-]*$")
    # the completion starts inside <think_tag> (the chat template ends the prompt with it, e.g. DeepSeek-R1-Distill,
    # Qwen3): without a closing tag it is all reasoning, so no answer tag in it counts
    starts_in_think: bool = False

    @field_validator("required_tags")
    @classmethod
    def _tags(cls, tags: list[str]) -> list[str]:
        bad = [t for t in tags if not _TAG_NAME.fullmatch(t)]
        if bad:
            raise ValueError(f"not tag names: {bad}")
        return tags

    @field_validator("pattern")
    @classmethod
    def _pattern(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            UserPattern(pattern)
        return pattern

    @model_validator(mode="after")
    def _something_to_check(self) -> FormatParams:
        if not self.required_tags and self.pattern is None:
            raise ValueError("give required_tags or pattern")
        return self


def tag_problems(text: str, tags: list[str], ordered: bool, nonempty: bool,
                 think: str | None = THINK_TAG, starts_in_think: bool = False) -> list[str]:
    """Why ``text`` fails the tag format: each tag exactly once as ``<t>...</t>``, in order, non-empty, and
    every tag but the think tag after the reasoning (reward_models.tags: ASCII case-insensitive names, the
    answer region; the same rule verifier.math reads its answer by)."""
    problems: list[str] = []
    folded = fold(text)  # same length as text: its indices are text's
    lo, hi = answer_region(folded, think, starts_in_think)
    last_end = -1
    for tag in tags:
        opener, closer = f"<{fold(tag)}>", f"</{fold(tag)}>"
        opens, closes = folded.count(opener), folded.count(closer)
        if opens != 1 or closes != 1:
            problems.append(f"<{tag}> must appear exactly once with </{tag}> (got {opens}/{closes})")
            continue
        start, end = folded.index(opener), folded.index(closer)
        if end < start:
            problems.append(f"</{tag}> before <{tag}>")
            continue
        if ordered and start < last_end:
            problems.append(f"<{tag}> out of order")
        last_end = end
        if think is not None and fold(tag) != fold(think) and not (lo <= start and end + len(closer) <= hi):
            problems.append(f"<{tag}> inside <{think}>: the answer must follow the reasoning")
        if nonempty and not text[start + len(opener) : end].strip():
            problems.append(f"<{tag}> is empty")
    return problems


def pattern_problems(text: str, regex: UserPattern, match: str, nonempty: bool) -> list[str]:
    """Why ``text`` fails the regex: no match, or an empty ``answer`` group (else group 1)."""
    found = regex.fullmatch(text) if match == "fullmatch" else regex.search(text)
    if found is None:
        return [f"no {match} for pattern"]
    if nonempty and regex.groups:
        group = "answer" if "answer" in regex.groupindex else 1
        if not (found.group(group) or "").strip():
            return [f"pattern group {group!r} is empty"]
    return []


class FormatRule(RewardComponent):
    """1.0 when the answer has the required tags / matches the regex with a non-empty answer, else 0.0.

    Format rewards in the style of DeepSeek-R1 (Guo et al. 2025): ``<think>..</think><answer>..</answer>``.
    """

    kind = "rule.format"
    Params = FormatParams

    def __init__(self, params: dict | None = None) -> None:
        super().__init__(params)
        self._regex = UserPattern(self.params.pattern) if self.params.pattern else None
        # a pattern RE2 cannot run as written (or only at a large cost) is matched in the killable
        # pool, under the deadline; so is any text too long to match inline (reward_models.patterns)
        self.cpu_heavy = self._regex is not None and not self._regex.inline_pattern

    def _text(self, sample: Sample) -> str:
        return sample.final_answer if self.params.source == "final_answer" else assistant_text(sample)

    def in_pool(self, sample: Sample, prompt: PromptInfo) -> bool:
        return self.cpu_heavy or (self._regex is not None and not self._regex.inline_ok(self._text(sample)))

    def evaluate(self, sample: Sample, prompt: PromptInfo) -> tuple[float, dict]:
        p = self.params
        text = self._text(sample)
        problems = tag_problems(text, p.required_tags, p.ordered, p.nonempty, p.think_tag, p.starts_in_think)
        if self._regex is not None:
            problems += pattern_problems(text, self._regex, p.match, p.nonempty)
        return (0.0 if problems else 1.0), {"failed": problems}


class LengthParams(ParamsModel):
    target: int = Field(ge=0)
    limit: int = Field(gt=0)
    unit: Literal["tokens", "chars", "words"] = "tokens"

    @model_validator(mode="after")
    def _order(self) -> LengthParams:
        if self.limit <= self.target:
            raise ValueError("limit must be > target")
        return self


def linear_length_penalty(length: int, target: int, limit: int) -> float:
    """0 up to ``target``, then linear down to -1 at ``limit`` and beyond."""
    return -min(max((length - target) / (limit - target), 0.0), 1.0)


class LengthRule(RewardComponent):
    """Length penalty: 0 for ``L <= target``, linear to -1 at ``limit`` (per-sample variant of the
    length penalties of Kimi k1.5, Team Kimi 2025)."""

    kind = "rule.length"
    Params = LengthParams

    def evaluate(self, sample: Sample, prompt: PromptInfo) -> tuple[float, dict]:
        length = response_length(sample, self.params.unit)
        value = linear_length_penalty(length, self.params.target, self.params.limit)
        return value, {"length": length, "unit": self.params.unit}


class OverlongParams(ParamsModel):
    max_tokens: int = Field(gt=0)
    buffer: int = Field(gt=0)

    @model_validator(mode="after")
    def _order(self) -> OverlongParams:
        if self.buffer > self.max_tokens:
            raise ValueError("buffer must be <= max_tokens")
        return self


class OverlongRule(RewardComponent):
    """DAPO soft overlong penalty on the response token count (`filters.overlong`, the one implementation
    the curation paths use too), with this spec's fixed max_tokens and buffer."""

    kind = "rule.overlong"
    Params = OverlongParams

    def evaluate(self, sample: Sample, prompt: PromptInfo) -> tuple[float, dict]:
        length = response_length(sample, "tokens")
        value = soft_overlong_penalty(length, self.params.max_tokens, self.params.buffer)
        return value, {"length": length}


class TurnsParams(ParamsModel):
    max_turns: int = Field(gt=0)
    buffer: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _order(self) -> TurnsParams:
        if self.buffer >= self.max_turns:
            raise ValueError("buffer must be < max_turns")
        return self


def turn_budget_penalty(turns: int, max_turns: int, buffer: int) -> float:
    """The overlong shape over assistant turns: 0 up to ``max_turns - buffer``, linear to -1 at
    ``max_turns`` (buffer 0: a step), -1 beyond."""
    if turns > max_turns:
        return -1.0
    if buffer == 0:
        return 0.0
    return min((max_turns - buffer - turns) / buffer, 0.0)


class TurnsRule(RewardComponent):
    """Turn-budget penalty on ``sample.num_turns``. A cut-off (``finish_reason == "max_turns"``) is
    handled by the curation policy's finish-reason action, not here."""

    kind = "rule.turns"
    Params = TurnsParams

    def evaluate(self, sample: Sample, prompt: PromptInfo) -> tuple[float, dict]:
        value = turn_budget_penalty(sample.num_turns, self.params.max_turns, self.params.buffer)
        return value, {"turns": sample.num_turns}
