"""A session's calls -> trajectory segments, by token prefix (never by re-tokenizing).

Call k extends the segment when its prompt ids start with the segment's ids so far (the previous
prompts, completions and the suffixes between them): the new suffix (tool output, template) gets loss
mask 0 and log-prob 0, the completion mask 1 with the upstream's log-probs. When they do not (the agent
rewrote history, a template renders differently) nothing is guessed: a new segment starts, and the break
is recorded as ``prefix_mismatch`` with the first differing position. A call after the agent's ``segment``
mark (``POST /v1/sessions/{id}/segment``: a summary checkpoint) starts a new segment too, whatever its
prompt, recorded as ``marked`` (its ``prefix_mismatch`` is None).

A resumed session (docs/agents.md, "Resume a cut member") starts from a ``seed``: its checkpoint's
arrays, which the first call's prompt ids must extend like any earlier call's (or a segment starts).
Each token carries the policy version that generated it (the call's; -1 for prompt / tool tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Segment:
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # per token: the call's policy version, -1 if not generated
    calls: list[int] = field(default_factory=list)  # the call indexes it holds
    prefix_mismatch: dict[str, int] | None = None  # why it started: {"call": k, "position": p}
    marked: bool = False  # it started at the agent's segment mark


@dataclass(frozen=True)
class TracedCall:
    index: int
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    version: int = -1  # the policy version that answered the call
    new_segment: bool = False  # the agent marked a segment since the previous answered call


def first_difference(a: list[int], b: list[int]) -> int:
    """The first position where ``a`` and ``b`` differ (the shorter length when one is a prefix)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def segments(calls: list[TracedCall], seed: Segment | None = None) -> list[Segment]:
    """Calls (answered ones, in order) -> segments; each completion appears in exactly one, mask 1. With a
    ``seed`` (a resume's checkpoint) the first segment starts from its arrays."""
    out: list[Segment] = [seed] if seed is not None else []
    for call in calls:
        seg = out[-1] if out else None
        n = len(seg.token_ids) if seg is not None else 0
        marked = call.new_segment and seg is not None and bool(seg.token_ids)
        if seg is None or marked or call.prompt_ids[:n] != seg.token_ids:
            mismatch = None
            if seg is not None and not marked:
                mismatch = {"call": call.index, "position": first_difference(seg.token_ids, call.prompt_ids)}
            seg = Segment(prefix_mismatch=mismatch, marked=marked)
            out.append(seg)
            n = 0
        suffix = call.prompt_ids[n:]
        seg.token_ids += suffix + call.completion_ids
        seg.loss_mask += [0] * len(suffix) + [1] * len(call.completion_ids)
        seg.logprobs += [0.0] * len(suffix) + list(call.logprobs)
        seg.versions += [-1] * len(suffix) + [call.version] * len(call.completion_ids)
        seg.calls.append(call.index)
    return out
