"""Curation throughput: groups per second through the pure functions of `filters/`.

Measures the vectorised `curate_groups` beside the per-group reference `curate_group` on the same
synthetic groups, checks they agree, and prints both rates and their ratio. Target (issue 4):
>= 50,000 groups of 8 per second through the vectorised path.

    python bench/curate.py --groups 50000 --size 8
"""

from __future__ import annotations

import argparse
import math
import random
import time
from collections.abc import Callable, Sequence

from filters.curate import curate_group, curate_groups
from filters.types import CurationPolicy, GroupDecision, GroupScore, TrajectoryScore

TARGET_GROUPS_PER_S = 50_000
# A plausible mix for a math / agent run: mostly answered, some budget cut-offs, few infra failures.
FINISH_MIX = {
    "stop": 0.82,
    "length": 0.08,
    "max_turns": 0.03,
    "tool_error": 0.03,
    "env_error": 0.01,
    "timeout": 0.02,
    "aborted": 0.01,
}


def synthetic_groups(n_groups: int, size: int, seed: int = 0) -> list[GroupScore]:
    """n_groups groups of `size` scored trajectories: binary outcome + format component, some
    reward errors (None), per-prompt difficulty so that some groups are all solved / all failed."""
    rng = random.Random(seed)
    reasons, weights = list(FINISH_MIX), list(FINISH_MIX.values())
    groups = []
    for g in range(n_groups):
        difficulty = rng.random()
        trajectories = []
        for i in range(size):
            outcome = 1.0 if rng.random() > difficulty else 0.0
            fmt = rng.choice((0.0, 0.1, 0.2))
            total = None if rng.random() < 0.01 else outcome + fmt
            finish = rng.choices(reasons, weights)[0]
            tokens = 1024 if finish == "length" else rng.randint(50, 1000)
            trajectories.append(
                TrajectoryScore(i, finish, total, {"math": outcome, "format": fmt}, outcome, tokens)
            )
        version = 10 - min(int(rng.expovariate(1.0)), 10)  # mostly fresh, a few past max_staleness
        groups.append(GroupScore(f"g{g}", version, trajectories, max_tokens=1024))
    return groups


def _rate(
    run: Callable[[], list[GroupDecision]], n_groups: int, repeats: int
) -> tuple[float, list[GroupDecision]]:
    """Best-of-`repeats` groups per second of `run`, and its last result."""
    best = math.inf
    result: list[GroupDecision] = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - start)
    return n_groups / best, result


def _agree(fast: Sequence[GroupDecision], ref: Sequence[GroupDecision]) -> bool:
    """Same statuses, actions and (to 1e-9) advantages."""
    for f, r in zip(fast, ref, strict=True):
        if (f.status, f.drop_reason) != (r.status, r.drop_reason):
            return False
        for a, b in zip(f.trajectories, r.trajectories, strict=True):
            if a.action != b.action or not math.isclose(a.advantage, b.advantage, abs_tol=1e-9):
                return False
    return True


def bench_pure(
    n_groups: int = 50_000, size: int = 8, repeats: int = 3, policy: CurationPolicy | None = None
) -> dict[str, float]:
    """Run the pure-function benchmark; returns groups/s of both paths, their ratio and drop rates."""
    policy = policy or CurationPolicy(max_staleness=4, finish_reason_actions={"max_turns": "penalize"})
    groups = synthetic_groups(n_groups, size)
    n_ref = min(n_groups, 5_000)
    fast_rate, fast = _rate(lambda: curate_groups(groups, policy, 10), n_groups, repeats)
    ref_rate, ref = _rate(lambda: [curate_group(g, policy, 10) for g in groups[:n_ref]], n_ref, repeats)
    if not _agree(fast[:n_ref], ref):
        raise AssertionError("vectorised and reference curation disagree")
    return {
        "groups": n_groups,
        "group_size": size,
        "vectorised_groups_per_s": fast_rate,
        "reference_groups_per_s": ref_rate,
        "speedup": fast_rate / ref_rate,
        "ready_fraction": sum(d.status == "ready" for d in fast) / n_groups,
        "target_met": float(fast_rate >= TARGET_GROUPS_PER_S),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    r = bench_pure(args.groups, args.size, args.repeats)
    print(f"curation of {r['groups']:,} groups of {r['group_size']} ({r['ready_fraction']:.0%} ready)")
    print(f"  vectorised curate_groups : {r['vectorised_groups_per_s']:>12,.0f} groups/s")
    print(f"  reference  curate_group  : {r['reference_groups_per_s']:>12,.0f} groups/s")
    print(f"  speedup (side by side)   : {r['speedup']:>12.1f}x")
    print(f"  target {TARGET_GROUPS_PER_S:,} groups/s    : {'met' if r['target_met'] else 'NOT met'}")


if __name__ == "__main__":
    main()
