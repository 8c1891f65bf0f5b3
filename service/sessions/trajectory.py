"""A session's calls -> trajectory segments, by token prefix (never by re-tokenizing).

Call k extends the segment when its prompt ids start with the segment's ids so far (the previous
prompts, completions and the suffixes between them): the new suffix (tool output, template) gets loss
mask 0 and log-prob 0, the completion mask 1 with the upstream's log-probs. When they do not (the agent
rewrote history, a template renders differently) nothing is guessed: a new segment starts, and the break
is recorded as ``prefix_mismatch`` with the first differing position.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Segment:
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)  # the call indexes it holds
    prefix_mismatch: dict[str, int] | None = None  # why it started: {"call": k, "position": p}


@dataclass(frozen=True)
class TracedCall:
    index: int
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]


def first_difference(a: list[int], b: list[int]) -> int:
    """The first position where ``a`` and ``b`` differ (the shorter length when one is a prefix)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def segments(calls: list[TracedCall]) -> list[Segment]:
    """Calls (answered ones, in order) -> segments; each completion appears in exactly one, mask 1."""
    out: list[Segment] = []
    for call in calls:
        seg = out[-1] if out else None
        n = len(seg.token_ids) if seg is not None else 0
        if seg is None or call.prompt_ids[:n] != seg.token_ids:
            mismatch = None
            if seg is not None:
                mismatch = {"call": call.index, "position": first_difference(seg.token_ids, call.prompt_ids)}
            seg = Segment(prefix_mismatch=mismatch)
            out.append(seg)
            n = 0
        suffix = call.prompt_ids[n:]
        seg.token_ids += suffix + call.completion_ids
        seg.loss_mask += [0] * len(suffix) + [1] * len(call.completion_ids)
        seg.logprobs += [0.0] * len(suffix) + list(call.logprobs)
        seg.calls.append(call.index)
    return out
