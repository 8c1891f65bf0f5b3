"""Truncation remedies compared: what a token budget that cuts episodes does to a tool-using policy under each
way of handling the cut members (docs/curation.md, "Remedies").

Task (`lookup_prompts`): an agent episode over the demo's alphabet (``abcd=``, `rollout.tasks`). The prompt
``xy=`` asks for a hidden letter H(x, y) (a fixed random table, so answering without looking is right 1 in 4
by chance). In its first turn the model either answers (a letter, then EOS) or gathers evidence: ``=`` then
EOS is the lookup tool's call, whose result -- the letter H(x, y) -- is appended as an observation (loss
mask 0) before a second turn that answers. Every turn has the same token budget (`--budget`, default 3:
one token more than a letter or the call, then EOS); a turn that does not stop within it cuts the episode
(``finish_reason: length``). A random-initialised policy is cut 67 % of the time at budget 3 (77 % at 2,
46 % at 6); what learning does to that depends on the arm (in 40-step smoke runs at budget 3: 16 % of the
training episodes cut under penalize, 66 % under mask). The question is what each remedy teaches: penalising cut episodes rewards answering
short, i.e. skipping the lookup.

Arms (one policy each, the same steps and batch size; zero-variance groups dropped in every arm):
- penalize: a cut member's reward is -1 (``length: penalize``);
- mask-in-baseline: its loss is masked but it stays in the group statistics at reward 0;
- mask (the default policy): masked and out of the baseline;
- resample: each cut member is replaced by a fresh episode of the prompt sampled with 2x the budget
  (once; a replacement cut again is masked), as a ``resample`` slot fill does;
- resume: each cut member is continued from its checkpoint (the state before the cut turn; no tool runs
  again) with 2x the budget, at most ``max_resumes`` (2) times, then masked, as a ``resume`` fill does;
- segment: a cut turn goes on in a new segment (a new sequence over the context so far, another budget),
  at most 3 segments; the trajectory is trained as segments sharing the member's advantage (broadcast).

One process per run, no service (like bench/curation_effect.py, whose model, sampler and trainer settings
it shares): episodes sampled by `rollout.sampler.HFSampler` with the current weights, outcome exact match,
`filters.curate_groups` curates, `trainer.step.train_step` trains one on-policy step per batch on
`trainer.packing` batches. After the steps: the pass rate (`--eval-samples` per prompt, temperature 1, the
tight budget, no remedy), the mean answer length (generated tokens per episode) and the share of
episodes that answer before gathering evidence. Median and min-max over seeds.

Run: ``nice -n 19 python -m bench.truncation [--seeds 5] [--steps 100] [--jobs 2] [--out bench/out]``;
writes ``truncation.json`` (every raw number) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import torch

from bench.curation_effect import GROUP_SIZE, MODEL
from filters import CurationPolicy, GroupScore, TrajectoryScore, curate_groups
from rollout.sampler import HFSampler
from rollout.tasks import DEMO_ALPHABET, EOS, LETTERS, CharTokenizer
from trainer.loss import LossConfig
from trainer.packing import pack_batch
from trainer.policy import PolicyLogprobs
from trainer.step import StepConfig, train_step
from trainer.worker import TrainerConfig, build_model

TOK = CharTokenizer(DEMO_ALPHABET)
LOOKUP = TOK.encode("=")[0]  # the tool call: "=" then EOS
MAX_RESUMES, MAX_SEGMENTS, MULTIPLIER = 2, 3, 2
# arm -> (curation policy, remedy applied to the cut members before curating)
ARMS: dict[str, tuple[CurationPolicy, str | None]] = {
    "penalize": (CurationPolicy(finish_reason_actions={"length": "penalize"}), None),
    "mask-in-baseline": (CurationPolicy(masked_in_baseline=True), None),
    "mask": (CurationPolicy(), None),
    "resample": (CurationPolicy(), "resample"),
    "resume": (CurationPolicy(), "resume"),
    "segment": (CurationPolicy(), "segment"),
}


def lookup_prompts(seed: int = 7) -> list[dict[str, Any]]:
    """16 prompts ``xy=``; the answer H(x, y) is a fixed random letter (what the lookup tool returns)."""
    rng = random.Random(seed)
    return [{"id": f"lookup-{x}{y}", "messages": [{"role": "user", "content": f"{x}{y}="}],
             "reference": {"answer": rng.choice(LETTERS)}} for x in LETTERS for y in LETTERS]


@dataclass
class Episode:
    """One agent episode: the token arrays, where each trained piece ends, what it answered."""

    ids: list[int]
    mask: list[int]
    logps: list[float]
    boundary: int  # len(ids) before the current turn (the checkpoint of a resume)
    turn: int = 0
    looked: bool = False  # it called the lookup tool (gathered evidence) before answering
    answer: list[int] = field(default_factory=list)
    finish: str = "open"  # open | stop | length
    segment_ends: list[int] = field(default_factory=list)  # segment arm: where each earlier segment ends
    resumes: int = 0

    @property
    def generated(self) -> int:
        return sum(self.mask)


def _sample(sampler: HFSampler, ctx: list[int], n: int, budget: int, rng: random.Random) -> list[Any]:
    return sampler.sample(ctx, n, budget, rng.randrange(2**31))


def _apply(ep: Episode, c: Any, hint: int, budget: int, sampler: HFSampler, rng: random.Random,
           segment: bool) -> None:
    """The model's turn ``c`` on ``ep``: a cut turn goes on in new segments (segment arm), else it ends the
    episode; the lookup call gets its observation; anything else is the answer."""
    ep.ids += c.tokens
    ep.mask += [1] * len(c.tokens)
    ep.logps += list(c.logprobs)
    text = list(c.tokens)
    while c.finish_reason == "length" and segment and len(ep.segment_ends) + 1 < MAX_SEGMENTS:
        ep.segment_ends.append(len(ep.ids))
        [c] = _sample(sampler, ep.ids, 1, budget, rng)
        ep.ids += c.tokens
        ep.mask += [1] * len(c.tokens)
        ep.logps += list(c.logprobs)
        text += c.tokens
    if c.finish_reason != "stop":
        ep.finish = "length"
        return
    body = [t for t in text if t != EOS]
    if ep.turn == 0 and body == [LOOKUP]:
        ep.looked, ep.turn = True, 1
        ep.ids.append(hint)  # the tool's result: an observation, never trained
        ep.mask.append(0)
        ep.logps.append(0.0)
        ep.boundary = len(ep.ids)
        return
    ep.answer, ep.finish = body, "stop"


def run_episodes(sampler: HFSampler, eps: list[Episode], hint: int, budget: int, rng: random.Random,
                 segment: bool = False) -> list[Episode]:
    """Play every open episode to its end; episodes at the same state share one ``generate`` call."""
    while True:
        open_ = [e for e in eps if e.finish == "open"]
        if not open_:
            return eps
        by_ctx: dict[tuple[int, ...], list[Episode]] = {}
        for e in open_:
            by_ctx.setdefault(tuple(e.ids), []).append(e)
        for ctx, members in by_ctx.items():
            for e, c in zip(members, _sample(sampler, list(ctx), len(members), budget, rng), strict=True):
                _apply(e, c, hint, budget, sampler, rng, segment)


def new_episodes(prompt_ids: list[int], n: int) -> list[Episode]:
    return [Episode(list(prompt_ids), [0] * len(prompt_ids), [0.0] * len(prompt_ids), len(prompt_ids)) for _ in range(n)]


def resumed(ep: Episode) -> Episode:
    """The episode at its checkpoint (before the cut turn): the cut tokens are gone, the rest kept."""
    k = ep.boundary
    return Episode(ep.ids[:k], ep.mask[:k], ep.logps[:k], k, ep.turn, ep.looked, resumes=ep.resumes + 1)


def remedy(arm_remedy: str | None, eps: list[Episode], prompt_ids: list[int], hint: int, budget: int,
           sampler: HFSampler, rng: random.Random) -> tuple[list[Episode], int]:
    """Cut members replaced in place (resample: once; resume: up to MAX_RESUMES); returns the members and
    how many extra episodes were sampled."""
    extra = 0
    rounds = {"resample": 1, "resume": MAX_RESUMES}.get(arm_remedy or "", 0)
    for _ in range(rounds):
        cut = [i for i, e in enumerate(eps) if e.finish == "length"]
        if not cut:
            break
        fresh = (new_episodes(prompt_ids, len(cut)) if arm_remedy == "resample"
                 else [resumed(eps[i]) for i in cut])
        run_episodes(sampler, fresh, hint, MULTIPLIER * budget, rng)
        for i, e in zip(cut, fresh, strict=True):
            eps[i] = e
        extra += len(cut)
    return eps, extra


def score(ep: Episode, answer: str) -> float:
    return float(ep.finish == "stop" and TOK.decode(ep.answer) == answer)


def to_batch_trajectory(ep: Episode, index: int, advantage: float, seg_adv: list[float] | None) -> dict[str, Any]:
    if not ep.segment_ends:
        return {"index": index, "token_ids": ep.ids, "loss_mask": ep.mask, "logprobs": ep.logps, "advantage": advantage}
    ends, segs, start = [*ep.segment_ends, len(ep.ids)], [], 0
    for k, end in enumerate(ends):
        mask = [0] * start + ep.mask[start:end]  # a new sequence over the context so far: only its own tokens train
        segs.append({"segment_index": k, "token_ids": ep.ids[:end], "loss_mask": mask, "logprobs": ep.logps[:end],
                     "advantage": seg_adv[k] if seg_adv else advantage})
        start = end
    return {"index": index, "advantage": advantage, "segments": segs}


@dataclass
class Run:
    arm: str
    seed: int
    groups_per_step: list[int] = field(default_factory=list)
    sampled: int = 0  # episodes sampled for training, remedies included
    remedy_samples: int = 0
    truncated: int = 0  # episodes cut at first sampling
    final: float = 0.0  # pass rate after the steps
    answer_length: float = 0.0  # mean generated tokens per eval episode
    early_answer: float = 0.0  # share of eval episodes that answered without the lookup
    eval_cut: float = 0.0  # share of eval episodes cut by the budget
    seconds: float = 0.0


def collect(run: Run, ctx: dict[str, Any], step: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Rounds of `groups` groups until `groups` are ready (at most `max_draws` x `groups` drawn)."""
    policy, arm_remedy = ARMS[run.arm]
    ready: list[dict[str, Any]] = []
    drawn = 0
    while len(ready) < args.groups and drawn < args.max_draws * args.groups:
        picked = [ctx["rng"].choice(ctx["prompts"]) for _ in range(args.groups)]
        drawn += len(picked)
        scores, members = [], []
        for g, prompt in enumerate(picked):
            ids, hint = TOK.render_prompt(prompt["messages"]), TOK.encode(prompt["reference"]["answer"])[0]
            eps = run_episodes(ctx["sampler"], new_episodes(ids, GROUP_SIZE), hint, args.budget, ctx["rng"],
                               segment=arm_remedy == "segment")
            run.sampled += len(eps)
            run.truncated += sum(e.finish == "length" or bool(e.segment_ends) for e in eps)
            eps, extra = remedy(arm_remedy, eps, ids, hint, args.budget, ctx["sampler"], ctx["rng"])
            run.sampled += extra
            run.remedy_samples += extra
            outcomes = [score(e, prompt["reference"]["answer"]) for e in eps]
            trajs = [TrajectoryScore(i, e.finish, o, {}, o, e.generated, e.turn + 1, len(e.segment_ends) + 1
                                     if e.segment_ends else 0) for i, (e, o) in enumerate(zip(eps, outcomes, strict=True))]
            scores.append(GroupScore(f"{run.arm}-{run.seed}-{step}-{drawn}-{g}", 0, trajs, args.budget))
            members.append(eps)
        for decision, eps in zip(curate_groups(scores, policy, None), members, strict=True):
            if decision.status != "ready" or len(ready) >= args.groups:
                continue
            trajs = [to_batch_trajectory(eps[d.index], d.index, d.advantage,
                                         list(d.segment_advantages) if d.segment_advantages else None)
                     for d in decision.trajectories if d.action in ("keep", "penalize")]
            ready.append({"id": decision.group_id, "policy_version": 0, "trajectories": trajs})
    run.groups_per_step.append(len(ready))
    return ready


@torch.no_grad()
def evaluate(sampler: HFSampler, prompts: list[dict[str, Any]], budget: int, n: int, seed: int) -> dict[str, float]:
    """Pass rate, mean generated tokens, share answering before the lookup, share cut: n episodes a prompt,
    the tight budget, no remedy."""
    rng = random.Random(seed)
    sampler.model.eval()
    eps_all, passed = [], 0
    for p in prompts:
        ids, hint = TOK.render_prompt(p["messages"]), TOK.encode(p["reference"]["answer"])[0]
        eps = run_episodes(sampler, new_episodes(ids, n), hint, budget, rng)
        passed += sum(score(e, p["reference"]["answer"]) for e in eps)
        eps_all += eps
    total = len(eps_all)
    return {"pass": passed / total, "length": sum(e.generated for e in eps_all) / total,
            "early": sum(e.finish == "stop" and not e.looked for e in eps_all) / total,
            "cut": sum(e.finish == "length" for e in eps_all) / total}


def run_arm(arm: str, seed: int, args: argparse.Namespace) -> Run:
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    model = build_model(TrainerConfig(model_config=MODEL, seed=seed))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    policy = PolicyLogprobs(model, 2048)
    step_cfg = StepConfig(loss=LossConfig())
    prompts = lookup_prompts()
    ctx = {"rng": random.Random(seed), "prompts": prompts, "sampler": HFSampler(model, EOS, TOK.pad_token_id)}
    run, t0 = Run(arm, seed), time.perf_counter()
    for step in range(1, args.steps + 1):
        groups = collect(run, ctx, step, args)
        if groups:
            model.train()
            train_step(policy, opt, pack_batch({"groups": groups}, 4096), step_cfg)
    ev = evaluate(ctx["sampler"], prompts, args.budget, args.eval_samples, 20_000 + seed)
    run.final, run.answer_length, run.early_answer, run.eval_cut = ev["pass"], ev["length"], ev["early"], ev["cut"]
    run.seconds = time.perf_counter() - t0
    return run


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


METRICS = {"pass_rate": "final", "answer_length": "answer_length", "early_answer_share": "early_answer",
           "eval_cut_share": "eval_cut"}


def summarize(runs: list[Run]) -> list[dict[str, Any]]:
    rows = []
    for arm in [a for a in ARMS if any(r.arm == a for r in runs)]:
        mine = sorted((r for r in runs if r.arm == arm), key=lambda r: r.seed)
        row: dict[str, Any] = {"arm": arm, "seeds": [r.seed for r in mine]}
        for key, attr in METRICS.items():
            row[key] = _spread([getattr(r, attr) for r in mine])
        row["train_cut_share"] = _spread([r.truncated / max(r.sampled - r.remedy_samples, 1) for r in mine])
        row["samples"] = _spread([float(r.sampled) for r in mine])
        row["groups_per_step"] = _spread([statistics.mean(r.groups_per_step) for r in mine])
        rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    cols = ["pass_rate", "answer_length", "early_answer_share", "train_cut_share", "samples"]
    print("\nmedian [min-max] over seeds")
    print(f"{'arm':>17} " + " ".join(f"{c:>22}" for c in cols))
    for row in rows:
        cells = " ".join(f"{row[c]['median']:8.3f} [{row[c]['min']:.2f}-{row[c]['max']:.2f}]".rjust(22) for c in cols)
        print(f"{row['arm']:>17} {cells}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=100, help="trainer steps, the same in every arm")
    ap.add_argument("--groups", type=int, default=4, help="groups per trainer step")
    ap.add_argument("--max-draws", type=int, default=8, help="a step draws at most this x groups")
    ap.add_argument("--budget", type=int, default=3, help="tokens per turn")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--eval-samples", type=int, default=16, help="episodes per prompt at the end")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--jobs", type=int, default=2, help="runs in parallel (one torch thread each)")
    ap.add_argument("--out", default="bench/out")
    args = ap.parse_args(argv)
    arms = args.arms.split(",")
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        ap.error(f"--arms: unknown {unknown}; choose from {list(ARMS)}")
    t0 = time.perf_counter()
    runs: list[Run] = []
    jobs = [(arm, seed) for seed in range(args.seeds) for arm in arms]
    with ProcessPoolExecutor(max_workers=max(1, args.jobs), mp_context=get_context("spawn")) as pool:
        for fut in [pool.submit(run_arm, arm, seed, args) for arm, seed in jobs]:
            r = fut.result()
            runs.append(r)
            print(f"{r.arm:>17} seed {r.seed}: pass {r.final:.3f}, length {r.answer_length:.2f}, early answers "
                  f"{r.early_answer:.3f}, train cut {r.truncated / max(r.sampled - r.remedy_samples, 1):.3f}, "
                  f"{r.sampled} samples, {r.seconds:.0f}s", flush=True)
    args.wall_seconds = time.perf_counter() - t0
    rows = summarize(runs)
    print_table(rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    body = {"args": vars(args), "summary": rows, "runs": [asdict(r) for r in runs]}
    (out / "truncation.json").write_text(json.dumps(body, indent=1))
    print(f"data: {out / 'truncation.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
