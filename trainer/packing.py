"""Leased batch -> micro-batches of tensors under a token budget.

A trajectory holds the full sequence x_0..x_{n-1} (prompt + response), its loss mask and the
sampler's log-probs, where logprobs[i] = log p(x_i | x_<i); a trajectory may come without them
(``logprobs: null``): it then has no behaviour policy (no truncated IS, no behaviour mismatch), and
trains only where pi_old is recomputed (`has_behaviour` marks the sequences that have one).
The model input at position t predicts x_{t+1}, so targets, loss mask and old log-probs are the
batch's columns shifted left by one.
Inputs stop at the last mask-1 target: later tokens cannot change any trained log-prob (causal
attention). Trajectories with no mask-1 token after position 0 are left out: they add nothing to
the loss or to its denominators.

Two layouts, both sorted by length (longest first):
- `pad`: rows of equal length (right-padded), rows * length <= budget per micro-batch.
- `pack`: one row per micro-batch, sequences concatenated (first-fit decreasing), position ids
  restarting at 0 for each sequence; transformers turns such position ids (with no attention mask
  and no cache) into a block-diagonal causal mask, so sequences do not attend to each other.
The loss side works on a per-sequence (S, Tm) layout; `gather_index` maps it onto the rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Literal, get_args

import torch
from torch import Tensor

from filters.segments import guess_segment_advantage, segment_weight
from trainer.loss import Segments, check_choice

PackMode = Literal["pad", "pack"]


@dataclass(frozen=True)
class TrainSeq:
    """One trajectory, already shifted: inputs x_0..x_{k-1} predict targets x_1..x_k."""

    inputs: list[int]
    targets: list[int]
    loss_mask: list[float]
    old_logp: list[float] | None  # the sampler's log-probs of the targets; None: not given
    advantage: float
    policy_version: int
    temperature: float = 1.0  # the group's sampling temperature
    weight: float = 1.0  # numerator weight of a segmented trajectory's segment: `filters.segments.segment_weight`
    share: float = 1.0  # its part of its trajectory in the denominator: 1/K of K trained segments
    unit: int = -1  # sequences with the same unit >= 0 (one trajectory's segments) share a mini-batch
    versions: list[int] | None = None  # the policy version that generated each target, -1: not generated


def mixed_versions(versions: list[int] | None, mask: list[float]) -> bool:
    """The trained tokens come from more than one policy version (a resumed episode)."""
    if versions is None:
        return False
    return len({v for v, m in zip(versions, mask, strict=True) if m > 0 and v >= 0}) > 1


@dataclass
class MicroBatch:
    """Tensors of one forward / backward pass. R rows of length L; S sequences of at most Tm tokens."""

    input_ids: Tensor  # (R, L) long
    position_ids: Tensor  # (R, L) long
    attention_mask: Tensor | None  # (R, L) long, None when no row is padded
    targets: Tensor  # (R, L) long, 0 on padding
    gather_index: Tensor  # (S, Tm) long, flat index into R * L (0 on padding)
    loss_mask: Tensor  # (S, Tm) float
    old_logp: Tensor  # (S, Tm) float
    advantages: Tensor  # (S,) float
    temperature: Tensor | None = None  # (R, L) float, each position's sampling temperature (None: the policy's)
    has_behaviour: Tensor | None = None  # (S,) bool, the sequence came with sampler log-probs (None: all did)
    seq_weights: Tensor | None = None  # (S,) float, numerator weights of segments (None: all 1)
    seq_shares: Tensor | None = None  # (S,) float, denominator shares of segments (None: all 1)
    versions: Tensor | None = None  # (S, Tm) long, each target's policy version, -1 unknown (None: none given)
    mixed: Tensor | None = None  # (S,) bool, the sequence's trained tokens come from several versions (resumed)

    @property
    def segments(self) -> Segments | None:
        """The per-rollout weights of its segmented trajectories' sequences (None: none is segmented)."""
        if self.seq_weights is None and self.seq_shares is None:
            return None
        ones = torch.ones(self.advantages.shape[0], device=self.advantages.device)
        return Segments(ones if self.seq_weights is None else self.seq_weights,
                        ones if self.seq_shares is None else self.seq_shares)

    @property
    def n_input_tokens(self) -> int:
        """Real (non-padding) input tokens."""
        if self.attention_mask is None:
            return self.input_ids.numel()
        return int(self.attention_mask.sum())

    def to(self, device: torch.device | str) -> MicroBatch:
        """A copy with every tensor on `device`."""
        moved: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            moved[f.name] = None if value is None else value.to(device, non_blocking=True)
        return replace(self, **moved)


def _shift(traj: dict[str, Any], version: int, where: str, temperature: float = 1.0) -> TrainSeq | None:
    """One leased trajectory -> its shifted TrainSeq, None when it has nothing to train."""
    ids, mask, lps = traj["token_ids"], traj["loss_mask"], traj.get("logprobs")
    versions = traj.get("versions")
    if len(ids) != len(mask) or (lps is not None and len(lps) != len(ids)) or (
            versions is not None and len(versions) != len(ids)):
        raise ValueError(f"{where}: token_ids, loss_mask, logprobs, versions differ in length")
    last = max((i for i in range(1, len(mask)) if mask[i]), default=0)  # last mask-1 target
    if last == 0:
        return None
    return TrainSeq(
        inputs=list(ids[:last]),
        targets=list(ids[1 : last + 1]),
        loss_mask=[float(v) for v in mask[1 : last + 1]],
        old_logp=None if lps is None else [float(v) for v in lps[1 : last + 1]],
        advantage=float(traj["advantage"]),
        policy_version=int(version),
        temperature=temperature,
        versions=None if versions is None else [int(v) for v in versions[1 : last + 1]],
    )


def _segments(traj: dict[str, Any], version: int, where: str, temperature: float, unit: int) -> list[TrainSeq]:
    """A segmented trajectory -> one TrainSeq per trained segment (K: its segments with a mask-1 target),
    all of one unit (kept in one mini-batch), each with its segment's advantage, denominator share 1/K (the
    trajectory counts once) and numerator weight `filters.segments.segment_weight` of the trajectory's
    ``segment_advantage`` (sent with the batch: its group's curation policy's): 1/K when each segment carries
    the trajectory's advantage (the per-rollout mean), 1 when the segments share it (``divide``: already
    A / K), so K divides once. A batch without it (a service that did not send it) gets
    `filters.segments.guess_segment_advantage`, which takes a ``discount`` trajectory whose advantages sum
    to A for ``divide``."""
    seqs = []
    for seg in traj["segments"]:
        adv = seg.get("advantage")
        shifted = _shift({**seg, "advantage": traj["advantage"] if adv is None else adv},
                         version, f"{where} segment {seg.get('segment_index')}", temperature)
        if shifted is not None:
            seqs.append(shifted)
    if not seqs:
        return []
    mode = traj.get("segment_advantage")
    if mode is None:  # fallback: guessed from the advantages (None: nothing to tell shares from copies by)
        whole = traj.get("advantage")
        mode = "broadcast" if whole is None else guess_segment_advantage(float(whole), [s.advantage for s in seqs])
    try:
        weight = segment_weight(mode, len(seqs))
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    return [replace(s, weight=weight, share=1.0 / len(seqs), unit=unit) for s in seqs]


def sequences_from_batch(batch: dict[str, Any], default_temperature: float = 1.0) -> list[TrainSeq]:
    """The leased-batch JSON ({"groups": [{"policy_version", "temperature"?, "trajectories": [...]}]}) ->
    shifted sequences; a group without a temperature gets `default_temperature`. A segmented trajectory
    (``segments``) gives one sequence per segment (see `_segments`)."""
    out: list[TrainSeq] = []
    unit = 0
    for group in batch["groups"]:
        temperature = group.get("temperature")
        temperature = default_temperature if temperature is None else float(temperature)
        if not 0 < temperature < float("inf"):
            raise ValueError(f"group {group.get('id')!r}: temperature must be a finite number > 0, got {temperature}")
        for traj in group["trajectories"]:
            where = f"group {group.get('id')!r} trajectory {traj.get('index')}"
            if traj.get("segments") is not None:
                out.extend(_segments(traj, group["policy_version"], where, temperature, unit))
                unit += 1
                continue
            seq = _shift(traj, group["policy_version"], where, temperature)
            if seq is not None:
                out.append(seq)
    return out


def _plan_pad(lengths: list[int], budget: int) -> list[list[int]]:
    """Indices sorted by length desc -> groups with len(group) * max length <= budget (>= 1 each)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    plans: list[list[int]] = []
    for i in order:
        if plans and (len(plans[-1]) + 1) * lengths[plans[-1][0]] <= budget:
            plans[-1].append(i)
        else:
            plans.append([i])
    return plans


def _plan_pack(lengths: list[int], budget: int) -> list[list[int]]:
    """First-fit decreasing: bins of total length <= budget (an over-long sequence gets its own bin)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    bins: list[list[int]] = []
    used: list[int] = []
    for i in order:
        slot = next((b for b, u in enumerate(used) if u + lengths[i] <= budget), None)
        if slot is None:
            bins.append([i])
            used.append(lengths[i])
        else:
            bins[slot].append(i)
            used[slot] += lengths[i]
    return bins


def _loss_side(seqs: Sequence[TrainSeq], offsets: list[int]) -> dict[str, Any]:
    """Per-sequence (S, Tm) tensors; offsets[s] = flat index of sequence s's first input token."""
    tm = max(len(s.inputs) for s in seqs)
    index = torch.zeros(len(seqs), tm, dtype=torch.long)  # (S, Tm)
    mask = torch.zeros(len(seqs), tm)  # (S, Tm)
    old = torch.zeros(len(seqs), tm)  # (S, Tm), 0 where the sampler gave no log-probs
    for s, (seq, off) in enumerate(zip(seqs, offsets, strict=True)):
        n = len(seq.inputs)
        index[s, :n] = torch.arange(off, off + n)
        mask[s, :n] = torch.tensor(seq.loss_mask)
        if seq.old_logp is not None:
            old[s, :n] = torch.tensor(seq.old_logp)
    adv = torch.tensor([s.advantage for s in seqs], dtype=torch.float32)  # (S,)
    has = torch.tensor([s.old_logp is not None for s in seqs])  # (S,)
    versions = None
    if any(s.versions is not None for s in seqs):
        versions = torch.full((len(seqs), tm), -1, dtype=torch.long)  # (S, Tm)
        for i, seq in enumerate(seqs):
            if seq.versions is not None:
                versions[i, : len(seq.versions)] = torch.tensor(seq.versions, dtype=torch.long)
    mixed = torch.tensor([mixed_versions(s.versions, s.loss_mask) for s in seqs])  # (S,)
    weights = torch.tensor([s.weight for s in seqs], dtype=torch.float32)  # (S,)
    shares = torch.tensor([s.share for s in seqs], dtype=torch.float32)  # (S,)
    return {
        "gather_index": index, "loss_mask": mask, "old_logp": old, "advantages": adv,
        "has_behaviour": None if bool(has.all()) else has,
        "seq_weights": None if bool((weights == 1).all()) else weights,
        "seq_shares": None if bool((shares == 1).all()) else shares,
        "versions": versions, "mixed": mixed if bool(mixed.any()) else None,
    }


def _pad_micro_batch(seqs: Sequence[TrainSeq]) -> MicroBatch:
    """Rows of equal length L = the longest sequence, right-padded."""
    r, length = len(seqs), max(len(s.inputs) for s in seqs)
    temp = torch.tensor([s.temperature for s in seqs])[:, None].expand(r, length).clone()  # (R, L)
    ids = torch.zeros(r, length, dtype=torch.long)  # (R, L)
    tgt = torch.zeros(r, length, dtype=torch.long)  # (R, L)
    att = torch.zeros(r, length, dtype=torch.long)  # (R, L)
    for i, s in enumerate(seqs):
        n = len(s.inputs)
        ids[i, :n], tgt[i, :n], att[i, :n] = torch.tensor(s.inputs), torch.tensor(s.targets), 1
    pos = torch.arange(length).expand(r, length).clone()  # (R, L)
    return MicroBatch(
        input_ids=ids,
        position_ids=pos,
        attention_mask=None if bool(att.all()) else att,
        targets=tgt,
        **_loss_side(seqs, [i * length for i in range(r)]),
        temperature=temp,
    )


def _packed_micro_batch(seqs: Sequence[TrainSeq]) -> MicroBatch:
    """One row: the sequences concatenated, positions restarting at 0 for each."""
    ids = torch.tensor([t for s in seqs for t in s.inputs])[None]  # (1, L)
    tgt = torch.tensor([t for s in seqs for t in s.targets])[None]  # (1, L)
    pos = torch.cat([torch.arange(len(s.inputs)) for s in seqs])[None]  # (1, L)
    starts = torch.tensor([0] + [len(s.inputs) for s in seqs[:-1]]).cumsum(0).tolist()
    temp = torch.cat([torch.full((len(s.inputs),), s.temperature) for s in seqs])[None]  # (1, L)
    return MicroBatch(
        input_ids=ids, position_ids=pos, attention_mask=None, targets=tgt, **_loss_side(seqs, starts),
        temperature=temp,
    )


def _units(seqs: Sequence[TrainSeq]) -> list[list[int]]:
    """Sequence indices by packing unit: a trajectory's segments together, every other sequence alone."""
    units: dict[int, list[int]] = {}
    out: list[list[int]] = []
    for i, s in enumerate(seqs):
        if s.unit < 0:
            out.append([i])
        elif s.unit in units:
            units[s.unit].append(i)
        else:
            units[s.unit] = [i]
            out.append(units[s.unit])
    return out


def _cost(seqs: Sequence[TrainSeq], unit: list[int], mode: str) -> int:
    """Input tokens a unit takes in a micro-batch of its own (pad: rows x the longest; pack: the sum)."""
    lengths = [len(seqs[i].inputs) for i in unit]
    return len(lengths) * max(lengths) if mode == "pad" else sum(lengths)


def _plan_units(seqs: Sequence[TrainSeq], token_budget: int, mode: str) -> list[list[int]]:
    """Micro-batch plans that keep a unit (a trajectory's segments) together when it fits the budget: pad
    rows cost len(rows) * the longest; pack bins the sum. A unit over the budget is split into its
    sequences (the loss is additive over sequences given the whole batch's denominators, so a trajectory of
    many segments never forces one micro-batch over the budget); a single sequence over it gets a
    micro-batch of its own."""
    units: list[list[int]] = []
    for u in _units(seqs):
        units.extend([u] if len(u) == 1 or _cost(seqs, u, mode) <= token_budget else [[i] for i in u])
    if all(len(u) == 1 for u in units):
        lengths = [len(s.inputs) for s in seqs]
        return _plan_pad(lengths, token_budget) if mode == "pad" else _plan_pack(lengths, token_budget)
    longest = [max(len(seqs[i].inputs) for i in u) for u in units]
    if mode == "pack":
        plans = _plan_pack([sum(len(seqs[i].inputs) for i in u) for u in units], token_budget)
        return [[i for b in plan for i in units[b]] for plan in plans]
    order = sorted(range(len(units)), key=lambda u: -longest[u])
    out: list[list[int]] = []
    width = 0
    for k in order:
        if out and (len(out[-1]) + len(units[k])) * width <= token_budget:
            out[-1].extend(units[k])
        else:
            out.append(list(units[k]))
            width = longest[k]
    return out


def pack_sequences(seqs: Sequence[TrainSeq], token_budget: int, mode: str = "pad") -> list[MicroBatch]:
    """Shifted sequences -> micro-batches whose input tokens (padding included) fit `token_budget`.

    A sequence longer than the budget gets a micro-batch of its own; a segmented trajectory's segments
    (one `unit`) share one micro-batch when they fit the budget together, else they are spread over several
    (`_plan_units`); `split_mini_batches` keeps them in one mini-batch either way.
    """
    check_choice("pack mode", mode, get_args(PackMode))
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    plans = _plan_units(seqs, token_budget, mode)
    build = _pad_micro_batch if mode == "pad" else _packed_micro_batch
    return [build([seqs[i] for i in plan]) for plan in plans]


def pack_batch(
    batch: dict[str, Any], token_budget: int, mode: str = "pad", default_temperature: float = 1.0
) -> list[MicroBatch]:
    """A leased batch (JSON form) -> micro-batches under `token_budget`; see `pack_sequences`.
    Each position is scored at its group's sampling temperature (`default_temperature` when absent)."""
    return pack_sequences(sequences_from_batch(batch, default_temperature), token_budget, mode)


def split_mini_batches(seqs: Sequence[TrainSeq], parts: int) -> list[list[TrainSeq]]:
    """Shifted sequences -> exactly `parts` mini-batches of whole trajectories, in batch order: the
    trajectories (a segmented one's segments count as one, and stay together) are cut into `parts`
    consecutive runs of near-equal count (run i holds trajectories round(i n / parts) .. round((i+1) n / parts) - 1).
    With fewer trajectories than `parts` some runs are empty (the step skips them: `mini_batches` records
    how many updates an epoch really took)."""
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
        raise ValueError(f"mini_batches must be an int >= 1, got {parts!r}")
    units = _units(seqs)
    bounds = [round(i * len(units) / parts) for i in range(parts + 1)]
    return [[seqs[i] for u in units[bounds[k] : bounds[k + 1]] for i in u] for k in range(parts)]


def pack_mini_batches(
    batch: dict[str, Any] | None, parts: int, token_budget: int, mode: str = "pad", default_temperature: float = 1.0
) -> list[list[MicroBatch]]:
    """A leased batch -> `parts` mini-batches (`split_mini_batches`), each packed into micro-batches under
    `token_budget` (`pack_sequences`); an empty mini-batch is one empty micro-batch, so every rank of a
    distributed step has `parts` of them and runs the same collectives. `batch` None: nothing to train."""
    seqs = sequences_from_batch(batch, default_temperature) if batch else []
    return [pack_sequences(part, token_budget, mode) if part else [empty_micro_batch()]
            for part in split_mini_batches(seqs, parts)]


def empty_micro_batch() -> MicroBatch:
    """One token with loss mask 0: lets a rank with no (or fewer) micro-batches join every collective
    of a step with zero gradient."""
    zero = torch.zeros(1, 1, dtype=torch.long)  # (1, 1)
    return MicroBatch(
        input_ids=zero,
        position_ids=zero.clone(),
        attention_mask=None,
        targets=zero.clone(),
        gather_index=zero.clone(),
        loss_mask=torch.zeros(1, 1),
        old_logp=torch.zeros(1, 1),
        advantages=torch.zeros(1),
    )
