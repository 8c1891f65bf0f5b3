"""Does curation help? GRPO with and without curation on a learnable task, same steps, same batch size.

Task (`task_prompts`): *letter-map* over ``abcd``. 16 learnable prompts ``xy=`` whose answer is pi(y), a
fixed permutation of the second letter (a->c, b->d, c->b, d->a; x is a distractor), one letter then EOS
within a 2-token budget, next to 8 impossible prompts ``xyz=`` whose reference has 4 letters: they never
fit the budget, so every group of them fails whole. A random-initialised policy answers right ~1/64 of
the time, so at first almost every group is all-wrong; once learned the learnable ones come back
all-right: many groups carry no GRPO signal, and the tight budget cuts many young answers. (The demo's
letter-sum, (x + y) mod 4, was not learned in this loop: in the runs tried, plain and curated, lr 5e-4 to
2e-3, up to 300 steps, the pass rate stayed around the chance 0.25, curated runs at one answer per
prompt. `--task letter-sum` runs it.)

One process, no service: the loop uses the project's parts directly -- groups of 8 are sampled with the
current weights of the demo's tiny random-initialised Qwen2 (2 layers, hidden 64) as
`rollout.sampler.HFSampler` samples (its settings, log-probs and EOS cut; the groups of a round in one
`generate` call), the outcome is exact match of the decoded answer (EOS removed, `finish_reason` stop),
`filters.curate_groups` curates, `filters.curriculum` weights the prompts of the curated arms, and
`trainer.step.train_step` (default `LossConfig`, one on-policy step per batch) trains on
`trainer.packing` batches. Every arm trains `steps` trainer steps on exactly `groups` groups each:
- plain: GRPO as it comes. `groups` prompts drawn uniformly, every group trained (zero-variance groups
  with advantage 0, diluting the token mean), cut samples kept as ordinary failures (reward 0);
- mask (the default policy): zero-variance groups dropped, cut samples masked and out of the group
  baseline (`masked_in_baseline: false`), groups drawn by curriculum priority until `groups` groups with
  signal are in hand (DAPO's dynamic sampling, capped at `max_draws` x `groups` draws a step);
- mask-in-baseline: the same with DAPO's published overlong filtering (`masked_in_baseline: true`: the
  cut member's loss is masked but it stays in the group statistics at reward 0);
- penalize: the same with cut samples at -1 (`length: penalize`, the end of DAPO's overlong ramp).
Every `eval_every` steps the pass rate on the learnable prompts (`eval_samples` each, temperature 1) is
measured on the side (not counted as samples drawn).

Run: ``nice -n 19 python -m bench.curation_effect [--quick] [--seeds 5] [--jobs 2] [--out bench/out]``.
Prints steps and samples to each threshold, the final pass rate and the cut share per arm (median and
min-max over seeds; a seed that never reaches a threshold counts as never, it is not dropped) and writes
``curation_effect.png`` and ``curation_effect.json`` (every raw number) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import torch

from filters import CurationPolicy, GroupScore, TrajectoryScore, ZeroVariance, curate_groups, priority_for
from rollout.sampler import HFSampler, _cut
from rollout.tasks import DEMO_ALPHABET, EOS, LETTERS, CharTokenizer, letter_sum_prompts
from trainer.loss import LossConfig
from trainer.packing import pack_batch
from trainer.policy import PolicyLogprobs
from trainer.step import StepConfig, train_step
from trainer.worker import TrainerConfig, build_model

MODEL = {"model_type": "qwen2", "vocab_size": 3 + len(DEMO_ALPHABET), "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 64, "tie_word_embeddings": True}
GROUP_SIZE = 8
PERMUTATION = {"a": "c", "b": "d", "c": "b", "d": "a"}
PLAIN = CurationPolicy(zero_variance=ZeroVariance(action="keep"), min_group_size=1,
                       finish_reason_actions={"length": "keep", "max_turns": "keep"})
# arm -> (curation policy, fill the batch with groups that carry signal + curriculum)
ARMS: dict[str, tuple[CurationPolicy, bool]] = {
    "plain": (PLAIN, False),
    "mask": (CurationPolicy(), True),
    "mask-in-baseline": (CurationPolicy(masked_in_baseline=True), True),
    "penalize": (CurationPolicy(finish_reason_actions={"length": "penalize"}), True),
}


def task_prompts(task: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """(prompts trained on, learnable prompts the pass rate is measured on, token budget) of a task."""
    if task == "letter-sum":
        prompts = letter_sum_prompts()
        return prompts, prompts, 3
    learnable = [{"id": f"letter-map-{x}{y}", "dataset": "letter-map", "messages": [{"role": "user", "content": f"{x}{y}="}],
                  "reference": {"answer": PERMUTATION[y]}} for x in LETTERS for y in LETTERS]
    rng = random.Random(23)
    triples = sorted(rng.sample([x + y + z for x in LETTERS for y in LETTERS for z in LETTERS], 8))
    impossible = [{"id": f"letter-map-{t}", "dataset": "letter-map", "messages": [{"role": "user", "content": f"{t}="}],
                   "reference": {"answer": t + t[0]}} for t in triples]  # 4 letters: never within 2 tokens
    return learnable + impossible, learnable, 2


@dataclass
class Run:
    """One arm, one seed: the eval curve and the sampling counters."""

    arm: str
    seed: int
    evals: list[list[float]] = field(default_factory=list)  # [step, trajectories sampled so far, pass rate]
    groups_per_step: list[int] = field(default_factory=list)  # groups trained on at each step
    groups_drawn: int = 0
    ready_groups: int = 0  # drawn groups the curation passed
    discarded: int = 0  # ready groups past a full batch (a round drew more than the step needed)
    sampled: int = 0
    no_signal_groups: int = 0  # drawn groups whose outcomes were all equal
    truncated: int = 0  # samples cut by the token budget
    final: float = 0.0  # pass rate at the end, with 4x the eval samples
    seconds: float = 0.0


def score(tok: CharTokenizer, prompt: dict[str, Any], completions: list[Any]) -> list[float]:
    """Outcome 1.0 when it stopped and the decoded answer (EOS removed) is exactly the reference."""
    answer = prompt["reference"]["answer"]
    return [float(c.finish_reason == "stop" and tok.decode([t for t in c.tokens if t != EOS]) == answer)
            for c in completions]


def to_batch_group(gid: str, ids: list[int], comps: list[Any], decision: Any) -> dict[str, Any]:
    """The leased-batch JSON of a curated group: the members that train (keep / penalize; a mask member
    carries no loss, so it is left out, as its tokens would be masked)."""
    trajs = []
    for c, d in zip(comps, decision.trajectories, strict=True):
        if d.action not in ("keep", "penalize"):
            continue
        trajs.append({"index": d.index, "token_ids": ids + c.tokens, "loss_mask": [0] * len(ids) + [1] * len(c.tokens),
                      "logprobs": [0.0] * len(ids) + list(c.logprobs), "advantage": d.advantage})
    return {"id": gid, "policy_version": 0, "trajectories": trajs}


@torch.no_grad()
def sample_round(sampler: HFSampler, prompt_ids: list[list[int]], n: int, max_tokens: int, seed: int) -> list[list[Any]]:
    """`HFSampler.sample` for several prompts in one `generate` call per prompt length (the same pure
    sampling settings and log-probs, the same EOS cut): n completions for each prompt, in order."""
    torch.manual_seed(seed)
    by_len: dict[int, list[int]] = {}
    for i, ids in enumerate(prompt_ids):
        by_len.setdefault(len(ids), []).append(i)
    out: list[list[Any]] = [[] for _ in prompt_ids]
    for rows in by_len.values():
        inputs = torch.tensor([prompt_ids[i] for i in rows for _ in range(n)], device=sampler.device)  # (R*n, P)
        gen = sampler.model.generate(
            inputs, attention_mask=torch.ones_like(inputs), do_sample=True, temperature=sampler.temperature,
            top_k=0, top_p=1.0, max_new_tokens=max_tokens, eos_token_id=sampler.eos, pad_token_id=sampler.pad,
            output_scores=True, return_dict_in_generate=True,
        )
        generated = gen.sequences[:, inputs.shape[1]:]  # (R*n, T)
        logp = torch.log_softmax(torch.stack(gen.scores, dim=1).float(), dim=-1)  # (R*n, T, V)
        logp = logp.gather(-1, generated.unsqueeze(-1)).squeeze(-1)  # (R*n, T)
        for k, (g, lp) in enumerate(zip(generated.tolist(), logp.tolist(), strict=True)):
            out[rows[k // n]].append(_cut(g, lp, sampler.eos))
    return out


def collect(run: Run, ctx: dict[str, Any], step: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The step's batch: plain draws `groups` groups and trains on them all; a curated arm draws rounds
    until `groups` groups are ready (at most `max_draws` x `groups` draws a step)."""
    policy, fill = ARMS[run.arm]
    cap = args.max_draws * args.groups if fill else args.groups
    ready: list[dict[str, Any]] = []
    draws = 0
    while len(ready) < args.groups and draws < cap:
        need = args.groups - len(ready)
        # a round as large as the run's share of groups with signal says it takes (one generate call);
        # ready groups past the batch are discarded, as DAPO's dynamic sampling does, and count as drawn
        # (the share over the last step and this one so far, with one pass and one fail as a prior)
        rate = (ctx["last"][0] + len(ready) + 1) / (ctx["last"][1] + draws + 2) if fill else 1.0
        n = min(math.ceil(need / rate), cap - draws)
        if fill:
            weights = [priority_for(ctx["history"].get(p["id"], []), policy.curriculum) for p in ctx["prompts"]]
            picked = ctx["rng"].choices(ctx["prompts"], weights=weights, k=n)
        else:
            picked = [ctx["rng"].choice(ctx["prompts"]) for _ in range(n)]
        prompt_ids = [ctx["tok"].render_prompt(p["messages"]) for p in picked]
        rounds = sample_round(ctx["sampler"], prompt_ids, GROUP_SIZE, ctx["budget"], ctx["rng"].randrange(2**31))
        groups = []
        for prompt, comps in zip(picked, rounds, strict=True):
            draws += 1
            gid = f"{run.arm}-{run.seed}-{step}-{draws}"
            outcomes = score(ctx["tok"], prompt, comps)
            run.sampled += len(comps)
            run.no_signal_groups += len(set(outcomes)) == 1
            run.truncated += sum(c.finish_reason == "length" for c in comps)
            trajs = [TrajectoryScore(i, c.finish_reason, o, {}, o, len(c.tokens))
                     for i, (c, o) in enumerate(zip(comps, outcomes, strict=True))]
            groups.append(GroupScore(gid, 0, trajs, ctx["budget"]))
        decisions = curate_groups(groups, policy, None)
        for prompt, ids, comps, decision in zip(picked, prompt_ids, rounds, decisions, strict=True):
            if decision.outcome_mean is not None:
                ctx["history"].setdefault(prompt["id"], []).append(decision.outcome_mean)
            if decision.status != "ready":
                continue
            run.ready_groups += 1
            if len(ready) < args.groups:
                ready.append(to_batch_group(decision.group_id, ids, comps, decision))
            else:
                run.discarded += 1
    run.groups_drawn += draws
    ctx["last"] = (len(ready), draws)
    run.groups_per_step.append(len(ready))
    return ready


@torch.no_grad()
def evaluate(model: Any, tok: CharTokenizer, prompts: list[dict[str, Any]], budget: int, seed: int, n: int) -> float:
    """Pass rate over `prompts`, n samples each at temperature 1 (batched per prompt length)."""
    torch.manual_seed(seed)
    model.eval()
    by_len: dict[int, list[dict[str, Any]]] = {}
    for p in prompts:
        by_len.setdefault(len(tok.render_prompt(p["messages"])), []).append(p)
    correct = total = 0
    for group in by_len.values():
        ids = torch.tensor([tok.render_prompt(p["messages"]) for p in group for _ in range(n)])  # (P*n, L)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0,
                             top_p=1.0, max_new_tokens=budget, eos_token_id=EOS, pad_token_id=tok.pad_token_id)
        for row, gen in enumerate(out[:, ids.shape[1]:].tolist()):
            answer = group[row // n]["reference"]["answer"]
            stop = gen.index(EOS) if EOS in gen else None
            correct += stop is not None and tok.decode(gen[:stop]) == answer
            total += 1
    return correct / total


def run_arm(arm: str, seed: int, args: argparse.Namespace) -> Run:
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    model = build_model(TrainerConfig(model_config=MODEL, seed=seed))
    tok = CharTokenizer(DEMO_ALPHABET)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    policy = PolicyLogprobs(model, 2048)
    step_cfg = StepConfig(loss=LossConfig())
    prompts, learnable, budget = task_prompts(args.task)
    ctx = {"rng": random.Random(seed), "prompts": prompts, "history": {}, "last": (0, 0), "tok": tok, "budget": budget,
           "sampler": HFSampler(model, EOS, tok.pad_token_id)}
    run, t0 = Run(arm, seed), time.perf_counter()
    run.evals.append([0, 0, evaluate(model, tok, learnable, budget, 10_000 + seed, args.eval_samples)])
    for step in range(1, args.steps + 1):
        groups = collect(run, ctx, step, args)
        if groups:
            train_step(policy, opt, pack_batch({"groups": groups}, 4096), step_cfg)
        if step % args.eval_every == 0 or step == args.steps:
            p = evaluate(model, tok, learnable, budget, 10_000 + seed + step, args.eval_samples)
            run.evals.append([step, run.sampled, p])
    run.final = evaluate(model, tok, learnable, budget, 20_000 + seed, 4 * args.eval_samples)
    run.seconds = time.perf_counter() - t0
    return run


def reach(run: Run, threshold: float) -> tuple[int, int] | None:
    """(trainer steps, trajectories sampled) at the first eval with pass rate >= threshold; None: never."""
    return next(((int(s), int(n)) for s, n, p in run.evals if p >= threshold), None)


def censored_stats(values: list[float | None]) -> dict[str, Any]:
    """Median and range over seeds where None is "never reached" (larger than any number): the median is
    None when half or more never reached, the max is None when any did not."""
    reached = sorted(v for v in values if v is not None)
    ordered: list[float] = reached + [math.inf] * (len(values) - len(reached))
    med = statistics.median(ordered) if ordered else math.inf
    return {"reached": len(reached), "of": len(values), "median": None if math.isinf(med) else med,
            "min": reached[0] if reached else None, "max": ordered[-1] if reached and not math.isinf(ordered[-1]) else None}


def fmt(st: dict[str, Any]) -> str:
    if not st["reached"]:
        return "never"
    med = "never" if st["median"] is None else f"{st['median']:.0f}"
    hi = "never" if st["max"] is None else f"{st['max']:.0f}"
    return f"{med} [{st['min']:.0f}-{hi}]"


def summarize(runs: list[Run], thresholds: list[float]) -> list[dict[str, Any]]:
    rows = []
    for arm in [a for a in ARMS if any(r.arm == a for r in runs)]:
        mine = sorted((r for r in runs if r.arm == arm), key=lambda r: r.seed)
        row: dict[str, Any] = {"arm": arm, "seeds": [r.seed for r in mine],
                               "groups_per_step": sorted({g for r in mine for g in r.groups_per_step}),
                               "steps": sorted({len(r.groups_per_step) for r in mine})}
        for t in thresholds:
            hits = [reach(r, t) for r in mine]
            row[f"steps_to_{t}"] = censored_stats([h[0] if h else None for h in hits])
            row[f"samples_to_{t}"] = censored_stats([h[1] if h else None for h in hits])
        # steps a curated arm could not fill within its draw cap (trained on fewer groups), per seed
        row["short_steps"] = [sum(g < max(r.groups_per_step) for g in r.groups_per_step) for r in mine]
        final = [r.final for r in mine]
        row["final"] = {"median": statistics.median(final), "min": min(final), "max": max(final)}
        for key, num, den in (("cut_share", "truncated", "sampled"), ("no_signal_share", "no_signal_groups", "groups_drawn")):
            vals = [getattr(r, num) / max(getattr(r, den), 1) for r in mine]
            row[key] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
        row["samples"] = {"median": statistics.median(r.sampled for r in mine), "min": min(r.sampled for r in mine),
                          "max": max(r.sampled for r in mine)}
        rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]], thresholds: list[float]) -> None:
    for row in rows:
        if any(row["short_steps"]):
            print(f"{row['arm']}: steps below {max(row['groups_per_step'])} groups (draw cap hit), per seed: {row['short_steps']}")
    head = f"{'arm':>17} " + " ".join(f"{'steps to ' + str(t):>20} {'samples to ' + str(t):>24}" for t in thresholds)
    print("\nmedian [min-max] over seeds; 'never': not reached in the step budget (counted, not dropped)")
    print(head + f" {'final pass':>18} {'cut share':>17} {'no-signal groups':>17} {'samples drawn':>22}")
    for row in rows:
        cells = " ".join(f"{fmt(row[f'steps_to_{t}']) + ' ' + _of(row[f'steps_to_{t}']):>20} "
                         f"{fmt(row[f'samples_to_{t}']):>24}" for t in thresholds)
        f, c, z, s = row["final"], row["cut_share"], row["no_signal_share"], row["samples"]
        print(f"{row['arm']:>17} {cells} {f['median']:8.3f} [{f['min']:.2f}-{f['max']:.2f}] "
              f"{c['median']:6.3f} [{c['min']:.2f}-{c['max']:.2f}] {z['median']:6.3f} [{z['min']:.2f}-{z['max']:.2f}] "
              f"{s['median']:8.0f} [{s['min']}-{s['max']}]")


def _of(st: dict[str, Any]) -> str:
    return f"({st['reached']}/{st['of']})"


COLORS = {"plain": "tab:orange", "mask": "tab:blue", "mask-in-baseline": "tab:green", "penalize": "tab:red"}


def plot(runs: list[Run], path: Path, thresholds: list[float], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    for arm in ARMS:
        mine = [r for r in runs if r.arm == arm]
        if not mine:
            continue
        steps = np.array([e[0] for e in mine[0].evals])
        curves = np.array([[e[2] for e in r.evals] for r in mine])  # (seeds, evals)
        samples = np.median(np.array([[e[1] for e in r.evals] for r in mine]), axis=0)
        for ax, xs in ((axes[0], steps), (axes[1], samples)):
            ax.plot(xs, np.median(curves, axis=0), color=COLORS[arm], label=f"{arm} (median of {len(mine)})")
            ax.fill_between(xs, curves.min(axis=0), curves.max(axis=0), color=COLORS[arm], alpha=0.15)
    for ax, label in ((axes[0], "trainer steps (same batch size in every arm)"),
                      (axes[1], "trajectories sampled (median over seeds)")):
        for t in thresholds:
            ax.axhline(t, color="grey", linewidth=0.8, linestyle="--")
        ax.set(xlabel=label, ylabel="pass rate, learnable prompts", ylim=(0, 1.02))
        ax.legend(fontsize=8)
    axes[1].set_xscale("log")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 seeds, 40 steps (a smoke run)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200, help="trainer steps, the same in every arm")
    ap.add_argument("--groups", type=int, default=4, help="groups per trainer step, the same in every arm")
    ap.add_argument("--max-draws", type=int, default=16, help="a curated step draws at most this x groups")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--task", choices=("letter-map", "letter-sum"), default="letter-map")
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--eval-samples", type=int, default=16, help="samples per learnable prompt at each eval")
    ap.add_argument("--threshold", type=float, nargs="+", default=[0.5, 0.8])
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--jobs", type=int, default=2, help="runs in parallel (one torch thread each)")
    ap.add_argument("--from-json", help="re-print the table and re-plot a saved curation_effect.json, no training")
    ap.add_argument("--out", default="bench/out")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.seeds = min(args.steps, 40), min(args.seeds, 2)
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        runs = [Run(**r) for r in saved["runs"]]
        return report(runs, argparse.Namespace(**(saved["args"] | {"out": args.out})), write_raw=False)
    arms = args.arms.split(",")
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        ap.error(f"--arms: unknown {unknown}; choose from {list(ARMS)}")
    jobs = [(arm, seed) for seed in range(args.seeds) for arm in arms]
    t0 = time.perf_counter()
    runs: list[Run] = []
    with ProcessPoolExecutor(max_workers=max(1, args.jobs), mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(run_arm, arm, seed, args) for arm, seed in jobs]
        for fut in futures:
            r = fut.result()
            runs.append(r)
            print(f"{r.arm:>17} seed {r.seed}: final pass {r.final:.3f} after {len(r.groups_per_step)} steps of "
                  f"{min(r.groups_per_step)}-{max(r.groups_per_step)} groups, {r.sampled} samples, cut "
                  f"{r.truncated / max(r.sampled, 1):.3f}, {r.seconds:.0f}s; 0.5 at {reach(r, 0.5)}, 0.8 at {reach(r, 0.8)}",
                  flush=True)
    args.wall_seconds = time.perf_counter() - t0
    return report(runs, args, write_raw=True)


def report(runs: list[Run], args: argparse.Namespace, write_raw: bool) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = summarize(runs, args.threshold)
    print_table(rows, args.threshold)
    title = (f"{args.task}: {args.steps} steps x {args.groups} groups of {GROUP_SIZE}, {len({r.seed for r in runs})} seeds "
             "(line: median, band: min-max over seeds)")
    plot(runs, out / "curation_effect.png", args.threshold, title)
    if write_raw:
        body = {"args": vars(args), "summary": rows, "runs": [asdict(r) for r in runs]}
        (out / "curation_effect.json").write_text(json.dumps(body, indent=1))
    print(f"plot: {out / 'curation_effect.png'}" + (f"  data: {out / 'curation_effect.json'}" if write_raw else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
