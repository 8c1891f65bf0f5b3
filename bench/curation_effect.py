"""Does curation help? The demo's GRPO loop with and without curation, over several seeds.

Task: mixed letter-sum (`rollout.tasks.mixed_letter_sum_prompts`): 20 prompts ``x=`` / ``xy=``
whose answer is one letter then EOS under a 3-token budget, learned by the demo's tiny random-initialised
Qwen2 (2 layers, hidden 64). Easy prompts soon give all-correct groups, hard ones all-wrong groups, and a
young policy often runs past the budget: the situations curation is for.

One process, no service: the loop uses the project's parts directly -- `rollout.sampler.HFSampler` samples
groups of 8 with the current weights, the outcome is exact match of the decoded answer (the letter-sum
spec's `verifier.exact_match` without normalisation), `filters.curate_groups` curates, `filters.curriculum`
picks prompts, and `trainer.step.train_step` (default `LossConfig`) trains on `trainer.packing` batches.
Arms:
- curated: zero-variance groups dropped (outcome), truncated samples penalised (`length: penalize`, -1),
  prompts drawn by curriculum priority (last 3 groups all solved / all failed -> priority 0.1), and more
  groups drawn (up to 4x) until a batch holds `groups` groups with signal (DAPO dynamic sampling);
- plain: every group kept (zero-variance groups train with advantage 0 and dilute the token mean),
  truncated samples kept as ordinary failures, prompts drawn uniformly.
Both train on batches of `groups` groups per step. Every `eval_every` steps the pass rate over all 20
prompts (4 samples each, temperature 1) is measured on the side (not counted as samples).

Run: ``nice -n 10 python -m bench.curation_effect [--quick] [--seeds 5] [--out bench-out]``.
Prints a table per arm (median and spread over seeds) and writes ``curation_effect.png`` / ``.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from filters import CurationPolicy, GroupScore, TrajectoryScore, ZeroVariance, curate_groups, priority_for
from rollout.sampler import HFSampler
from rollout.tasks import DEMO_ALPHABET, EOS, CharTokenizer, mixed_letter_sum_prompts
from trainer.loss import LossConfig
from trainer.packing import pack_batch
from trainer.policy import PolicyLogprobs
from trainer.step import StepConfig, train_step
from trainer.worker import TrainerConfig, build_model

MODEL = {"model_type": "qwen2", "vocab_size": 3 + len(DEMO_ALPHABET), "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 64, "tie_word_embeddings": True}
MAX_TOKENS, GROUP_SIZE = 3, 8
CURATED = CurationPolicy(finish_reason_actions={"length": "penalize"})
PLAIN = CurationPolicy(zero_variance=ZeroVariance(action="keep"), min_group_size=1,
                       finish_reason_actions={"length": "keep", "max_turns": "keep"})


@dataclass
class Run:
    """One arm, one seed: the eval curve and the sampling counters."""

    arm: str
    seed: int
    evals: list[tuple[int, int, float]] = field(default_factory=list)  # (step, trajectories sampled, pass rate)
    sampled: int = 0
    no_signal: int = 0  # trajectories in groups whose outcomes were all equal
    truncated: int = 0
    seconds: float = 0.0


def score(tok: CharTokenizer, prompt: dict[str, Any], completions: list[Any]) -> list[float]:
    """Outcome 1.0 when the decoded answer (EOS removed) is exactly the reference letter and it stopped."""
    answer = prompt["reference"]["answer"]
    return [float(c.finish_reason == "stop" and tok.decode([t for t in c.tokens if t != EOS]) == answer)
            for c in completions]


def sample_group(sampler: HFSampler, tok: CharTokenizer, prompt: dict[str, Any], seed: int) -> tuple[list, list, list]:
    ids = tok.render_prompt(prompt["messages"])
    comps = sampler.sample(ids, GROUP_SIZE, MAX_TOKENS, seed)
    return ids, comps, score(tok, prompt, comps)


def to_batch_group(gid: str, ids: list[int], comps: list[Any], decision: Any) -> dict[str, Any]:
    """The leased-batch JSON of a curated group: members the trainer gets (keep / penalize)."""
    trajs = []
    for c, d in zip(comps, decision.trajectories, strict=True):
        if d.action not in ("keep", "penalize"):
            continue
        trajs.append({"index": d.index, "token_ids": ids + c.tokens, "loss_mask": [0] * len(ids) + [1] * len(c.tokens),
                      "logprobs": [0.0] * len(ids) + list(c.logprobs), "advantage": d.advantage})
    return {"id": gid, "policy_version": 0, "trajectories": trajs}


def pick_prompts(rng: random.Random, prompts: list[dict[str, Any]], history: dict[str, list[float]], n: int,
                 curated: bool) -> list[dict[str, Any]]:
    if not curated:
        return [rng.choice(prompts) for _ in range(n)]
    weights = [priority_for(history.get(p["id"], []), CURATED.curriculum) for p in prompts]
    return rng.choices(prompts, weights=weights, k=n)


def collect(run: Run, ctx: dict[str, Any], step: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Draw groups until `args.groups` of them are trainable (curated: up to 4x draws) -> batch groups."""
    curated = run.arm == "curated"
    policy = CURATED if curated else PLAIN
    ready: list[dict[str, Any]] = []
    draws = 0
    while len(ready) < args.groups and draws < (4 * args.groups if curated else args.groups):
        for prompt in pick_prompts(ctx["rng"], ctx["prompts"], ctx["history"], args.groups - len(ready), curated):
            draws += 1
            gid = f"{run.arm}-{run.seed}-{step}-{draws}"
            ids, comps, outcomes = sample_group(ctx["sampler"], ctx["tok"], prompt, ctx["rng"].randrange(2**31))
            run.sampled += len(comps)
            run.no_signal += len(comps) * (len(set(outcomes)) == 1)
            run.truncated += sum(c.finish_reason == "length" for c in comps)
            trajs = [TrajectoryScore(i, c.finish_reason, o, {}, o, len(c.tokens))
                     for i, (c, o) in enumerate(zip(comps, outcomes, strict=True))]
            [decision] = curate_groups([GroupScore(gid, 0, trajs, MAX_TOKENS)], policy, None)
            if decision.outcome_mean is not None:
                ctx["history"].setdefault(prompt["id"], []).append(decision.outcome_mean)
            if decision.status == "ready":
                ready.append(to_batch_group(gid, ids, comps, decision))
    return ready


@torch.no_grad()
def evaluate(model: Any, tok: CharTokenizer, prompts: list[dict[str, Any]], seed: int, n: int = 4) -> float:
    """Pass rate over every prompt, n samples each at temperature 1 (batched per prompt length)."""
    torch.manual_seed(seed)
    model.eval()
    by_len: dict[int, list[dict[str, Any]]] = {}
    for p in prompts:
        by_len.setdefault(len(tok.render_prompt(p["messages"])), []).append(p)
    correct = total = 0
    for group in by_len.values():
        ids = torch.tensor([tok.render_prompt(p["messages"]) for p in group for _ in range(n)])  # (P*n, L)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0,
                             top_p=1.0, max_new_tokens=MAX_TOKENS, eos_token_id=EOS, pad_token_id=tok.pad_token_id)
        for row, gen in enumerate(out[:, ids.shape[1]:].tolist()):
            answer = group[row // n]["reference"]["answer"]
            stop = gen.index(EOS) if EOS in gen else None
            correct += stop is not None and tok.decode(gen[:stop]) == answer
            total += 1
    return correct / total


def run_arm(arm: str, seed: int, args: argparse.Namespace) -> Run:
    torch.manual_seed(seed)
    model = build_model(TrainerConfig(model_config=MODEL, seed=seed))
    tok = CharTokenizer(DEMO_ALPHABET)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    policy = PolicyLogprobs(model, 2048)
    step_cfg = StepConfig(loss=LossConfig())
    ctx = {"rng": random.Random(seed), "prompts": mixed_letter_sum_prompts(), "history": {}, "tok": tok,
           "sampler": HFSampler(model, EOS, tok.pad_token_id)}
    run, t0 = Run(arm, seed), time.perf_counter()
    run.evals.append((0, 0, evaluate(model, tok, ctx["prompts"], 10_000 + seed)))
    for step in range(1, args.steps + 1):
        groups = collect(run, ctx, step, args)
        if groups:
            train_step(policy, opt, pack_batch({"groups": groups}, 4096), step_cfg)
        if step % args.eval_every == 0:
            run.evals.append((step, run.sampled, evaluate(model, tok, ctx["prompts"], 10_000 + seed + step)))
    run.seconds = time.perf_counter() - t0
    return run


def reach(run: Run, threshold: float) -> tuple[int, int] | None:
    """(trainer steps, trajectories sampled) at the first eval with pass rate >= threshold."""
    return next(((s, n) for s, n, p in run.evals if p >= threshold), None)


def _spread(values: list[float]) -> str:
    if not values:
        return "      -      "
    return f"{statistics.median(values):7.1f} [{min(values):.0f}-{max(values):.0f}]"


def table(runs: list[Run], threshold: float) -> list[dict[str, Any]]:
    rows = []
    print(f"\nthreshold: pass rate >= {threshold} on all prompts; median [min-max] over seeds")
    print(f"{'arm':>8} {'reached':>8} {'steps to thr':>20} {'samples to thr':>22} {'final pass':>18} "
          f"{'no-signal frac':>15} {'truncated frac':>15}")
    for arm in sorted({r.arm for r in runs}):
        mine = [r for r in runs if r.arm == arm]
        hits = [h for h in (reach(r, threshold) for r in mine) if h is not None]
        final = [r.evals[-1][2] for r in mine]
        no_signal = [r.no_signal / max(r.sampled, 1) for r in mine]
        trunc = [r.truncated / max(r.sampled, 1) for r in mine]
        print(f"{arm:>8} {len(hits):>4}/{len(mine):<3} {_spread([h[0] for h in hits]):>20} "
              f"{_spread([h[1] for h in hits]):>22} {statistics.median(final):8.3f} [{min(final):.2f}-{max(final):.2f}] "
              f"{statistics.median(no_signal):15.3f} {statistics.median(trunc):15.3f}")
        rows.append({"arm": arm, "reached": len(hits), "seeds": len(mine), "steps": [h[0] for h in hits],
                     "samples": [h[1] for h in hits], "final": final, "no_signal": no_signal, "truncated": trunc})
    return rows


def plot(runs: list[Run], path: Path, threshold: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for arm, color in (("curated", "tab:blue"), ("plain", "tab:orange")):
        mine = [r for r in runs if r.arm == arm]
        if not mine:
            continue
        steps = np.array([s for s, _, _ in mine[0].evals])
        curves = np.array([[p for _, _, p in r.evals] for r in mine])  # (seeds, evals)
        samples = np.array([[n for _, n, _ in r.evals] for r in mine]).mean(axis=0)
        for ax, xs in ((axes[0], steps), (axes[1], samples)):
            ax.plot(xs, np.median(curves, axis=0), color=color, label=f"{arm} (median of {len(mine)})")
            ax.fill_between(xs, curves.min(axis=0), curves.max(axis=0), color=color, alpha=0.2)
    for ax, label in ((axes[0], "trainer steps"), (axes[1], "trajectories sampled (mean over seeds)")):
        ax.axhline(threshold, color="grey", linewidth=0.8)
        ax.set(xlabel=label, ylabel="pass rate, all 20 prompts", ylim=(0, 1.02))
        ax.legend()
    fig.suptitle("mixed letter-sum: curation vs none (band: min-max over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps (a smoke run, a minute or two)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--groups", type=int, default=4, help="groups per trainer step")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--threshold", type=float, nargs="+", default=[0.2, 0.3],
                    help="pass rates to report steps / samples to (the plot marks the last)")
    ap.add_argument("--from-json", help="re-print the table and re-plot a saved curation_effect.json, no training")
    ap.add_argument("--arms", default="curated,plain")
    ap.add_argument("--out", default="bench-out")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.seeds = min(args.steps, 40), min(args.seeds, 2)
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())["runs"]
        runs = [Run(r["arm"], r["seed"], [tuple(e) for e in r["evals"]], r["sampled"], r["no_signal"],
                    r["truncated"], r["seconds"]) for r in saved]
        return report(runs, args, write_raw=False)
    torch.set_num_threads(1)
    runs = []
    for seed in range(args.seeds):
        for arm in args.arms.split(","):
            runs.append(run_arm(arm, seed, args))
            r = runs[-1]
            print(f"{arm:>8} seed {seed}: final pass {r.evals[-1][2]:.3f} after {args.steps} steps, "
                  f"{r.sampled} samples, {r.seconds:.0f}s; reached {reach(r, args.threshold[-1])}", flush=True)
    return report(runs, args, write_raw=True)


def report(runs: list[Run], args: argparse.Namespace, write_raw: bool) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [table(runs, t) for t in args.threshold]
    plot(runs, out / "curation_effect.png", args.threshold[-1])
    if write_raw:
        raw = [{"arm": r.arm, "seed": r.seed, "evals": r.evals, "sampled": r.sampled, "no_signal": r.no_signal,
                "truncated": r.truncated, "seconds": r.seconds} for r in runs]
        body = {"args": vars(args), "summary": rows, "runs": raw}
        (out / "curation_effect.json").write_text(json.dumps(body, indent=1))
    print(f"plot: {out / 'curation_effect.png'}  data: {out / 'curation_effect.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
