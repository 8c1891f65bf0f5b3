"""``grpo-curator demo``: the whole loop on a laptop, no configuration, embedded PostgreSQL.

Starts four real processes -- the service (with its score / curate worker), a rollout producer and a
GRPO trainer -- on the letter-sum task (``rollout.tasks``): a tiny random-initialised model learns to
answer ``xy=`` with the letter at (x + y) mod 4 under a 3-token budget, so truncated samples and
zero-variance groups really occur. Prints progress, then a table and a PNG plot of the mean outcome
per policy version with filter and truncation rates. ``--no-curation`` runs the same thing with
zero-variance filtering and truncation masking off; ``--compare`` runs both and prints them side by side.
Then (unless ``--no-agent``) a tool-using agent episode group through the session gateway: the loop of
``rollout.agent_example`` against the demo's own ``grpo-curator infer --tiny`` upstream (docs/agents.md),
printing each session's calls, tokens and trained tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from rollout.tasks import DEMO_ALPHABET, letter_sum_prompts, letter_sum_spec
from service.auth.keys import provision_local
from service.client import API_KEY_ENV, health_client, wait_healthy
from service.store.processes import spawn_tied, stop_all

ROOT = Path(__file__).resolve().parents[1]
MODEL = {"model_type": "qwen2", "vocab_size": 3 + len(DEMO_ALPHABET), "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 64, "tie_word_embeddings": True}
# `--engine vllm`: vLLM's CPU attention needs head_dim 64 (MODEL's is 16), so the same model at hidden 128, 2 heads
VLLM_MODEL = {**MODEL, "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 2, "num_key_value_heads": 1}
# the curated arm of bench/curation_effect.py: zero-variance filtering on the binary outcome, and -1 for a
# sample cut by the budget (`penalize` on `length` is exactly -1: a cut sample sits at the end of DAPO's ramp)
CURATED = {"name": "demo-curated", "finish_reason_actions": {"length": "penalize"}}
CURATED_MASK = {"name": "demo-curated-mask"}  # the default policy: truncated samples masked
UNCURATED = {"name": "demo-uncurated", "zero_variance": {"action": "keep"}, "min_group_size": 1,
             "finish_reason_actions": {r: "keep" for r in ("length", "max_turns")}}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    # tied to the demo: SIGTERM reaches each child when the demo dies, even by SIGKILL
    with log.open("w") as sink:
        return spawn_tied([sys.executable, *args], env=env, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT)


def start_service(out: Path, env: dict[str, str], procs: list[subprocess.Popen], timeout_s: float = 120.0) -> str:
    """Start ``serve`` (appended to ``procs`` at once, so the caller's cleanup stops it whatever happens
    next) and wait for /healthz; returns its URL."""
    port = _free_port()
    proc = _spawn(["-m", "service.cli", "serve", "--port", str(port)], env, out / "service.log")
    procs.append(proc)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout_s=timeout_s)
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}; see {out / 'service.log'}") from None
    return url


class DemoInterrupted(Exception):
    """Ctrl-C during a run: carries what the run had seen so far (its per-version rows)."""

    def __init__(self, partial: dict[str, Any]) -> None:
        super().__init__("interrupted")
        self.partial = partial


_SIGINT = threading.Event()  # set by Ctrl-C: a connection error after it is the service stopping, not a failure


def _on_sigint(signum: int, frame: Any) -> None:
    _SIGINT.set()
    raise KeyboardInterrupt


def _policy(curated: bool, truncation: str) -> dict[str, Any]:
    if not curated:
        return UNCURATED
    return CURATED if truncation == "penalize" else CURATED_MASK


def configure(url: str, policy: dict[str, Any], headers: dict[str, str]) -> None:
    with httpx.Client(base_url=url, timeout=30, headers=headers) as http:
        for path, body in (("/v1/prompts", {"prompts": letter_sum_prompts()}), ("/v1/reward-specs", letter_sum_spec()),
                           ("/v1/curation-policies", policy)):
            http.post(path, json=body).raise_for_status()
        body = {"reward_spec": "letter-sum", "curation_policy": policy["name"]}
        http.put("/v1/datasets/letter-sum", json=body).raise_for_status()


def start_workers(url: str, out: Path, env: dict[str, str], args: argparse.Namespace, keys: dict[str, str]) -> list[subprocess.Popen]:
    ckpt = str(out / "checkpoints")
    model = VLLM_MODEL if args.engine == "vllm" else MODEL
    trainer = {"service_url": url, "trainer_id": "demo-trainer", "model_config": model, "seed": 0, "lr": args.lr,
               "max_groups": args.groups_per_step, "min_groups": args.groups_per_step, "wait_seconds": 5.0, "checkpoint_dir": ckpt, "save_every": 1,
               "max_staleness": 1, "loss": {"beta": 0.0}}
    producer = {"service_url": url, "producer_id": "demo-producer", "run_id": "demo", "model_config": model, "seed": 0,
                "backend": "hf" if args.engine == "transformers" else "vllm",
                "tokenizer": "char:" + DEMO_ALPHABET, "checkpoint_dir": ckpt, "dataset": "letter-sum",
                "group_size": 8, "max_tokens": 3, "requests_per_poll": args.groups_per_step,
                "max_backlog": 2 * args.groups_per_step, "poll_seconds": 0.2, "spool_dir": str(out / "spool")}
    (out / "trainer.json").write_text(json.dumps(trainer))
    (out / "producer.json").write_text(json.dumps(producer))
    return [_spawn(["-m", "trainer.worker", "--config", str(out / "trainer.json")], {**env, API_KEY_ENV: keys["demo-trainer"]}, out / "trainer.log"),
            _spawn(["-m", "rollout.producer", "--config", str(out / "producer.json")], {**env, API_KEY_ENV: keys["demo-producer"]}, out / "producer.log")]


def per_version(url: str, headers: dict[str, str]) -> list[dict[str, Any]]:
    rows = httpx.get(url + "/v1/stats", params={"by": "policy_version"}, timeout=30, headers=headers).json()["rows"]
    return sorted(rows, key=lambda r: int(r["key"]))


def run_once(args: argparse.Namespace, curated: bool) -> dict[str, Any]:
    """One full run; returns the per-version rows and the steps to reach the threshold."""
    label = f"curated ({args.truncation} truncated)" if curated else "no-curation"
    out = Path(args.out) / label.replace(" ", "-").replace("(", "").replace(")", "")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "GRPO_CURATOR_DATABASE_URL")}
    env.update(GRPO_CURATOR_DATA_DIR=str(out / "state"), GRPO_CURATOR_WORKER_POLL_SECONDS="0.1",
               GRPO_CURATOR_LOG_LEVEL="warning", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    # auth on: the demo makes its own keys (admin for itself, one each for the trainer and the producer)
    keys = provision_local(out / "state", {"demo-admin": "admin", "demo-trainer": "trainer", "demo-producer": "producer"})
    headers = {"Authorization": f"Bearer {keys['demo-admin']}"}
    procs: list[subprocess.Popen] = []
    rows: list[dict[str, Any]] = []  # what the run has seen so far (kept when it is interrupted)
    try:  # everything started is in procs from the moment it exists: a signal or a failure stops it all
        url = start_service(out, env, procs, args.startup_timeout)
        configure(url, _policy(curated, args.truncation), headers)
        procs += start_workers(url, out, env, args, keys)
        rows = _watch(url, procs, args, label, headers, rows)
    except (KeyboardInterrupt, httpx.TransportError, RuntimeError) as exc:
        if not (isinstance(exc, KeyboardInterrupt) or _SIGINT.is_set()):
            raise
        raise DemoInterrupted(_result(label, rows, args.threshold, out)) from None
    finally:
        stop_all(reversed(procs))  # SIGTERM first, also on Ctrl-C / SIGTERM / failure: the service stops its PostgreSQL
    return _result(label, rows, args.threshold, out)


def _result(label: str, rows: list[dict[str, Any]], threshold: float, out: Path) -> dict[str, Any]:
    return {"label": label, "rows": rows, "steps_to_threshold": versions_to_reach(rows, threshold), "out": str(out)}


def versions_to_reach(rows: list[dict[str, Any]], threshold: float, window: int = 10) -> int | None:
    """The first policy version v whose next ``window`` versions have a trajectory-weighted mean pass rate
    >= threshold (one version's 32-64 samples are too noisy to read alone)."""
    keys = [int(r["key"]) for r in rows]
    for start in keys:
        sel = [r for r in rows if start <= int(r["key"]) < start + window]
        n = sum(r["count"] for r in sel)
        if n and sum(r["count"] * (r.get("pass_rate") or 0.0) for r in sel) / n >= threshold:
            return start
    return None


def _watch(url: str, procs: list[subprocess.Popen], args: argparse.Namespace, label: str, headers: dict[str, str],
           rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Print progress until the run is done; ``rows`` (the caller's list) holds the latest per-version rows."""
    start = time.monotonic()
    version = 0
    while time.monotonic() - start < args.minutes * 60 and version < args.versions:
        time.sleep(3)
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"a demo process exited early (see the logs under {args.out})")
        version = int(httpx.get(url + "/v1/policy", timeout=10, headers=headers).json()["version"])
        rows[:] = per_version(url, headers)
        last = rows[-1] if rows else {}
        print(f"[{label}] {time.monotonic() - start:5.0f}s  policy v{version:<4d} sampled-at v{last.get('key', '-')}: "
              f"pass rate {_f(last.get('pass_rate'))}  groups dropped {_f(_dropped(last))}  "
              f"truncated {_f(_truncated(last))}", flush=True)
    rows[:] = per_version(url, headers)
    return rows


def _f(x: float | None) -> str:
    return "  -  " if x is None else f"{x:.3f}"


def _dropped(row: dict[str, Any]) -> float | None:
    d = row.get("drop_fraction")
    return None if d is None else sum(d.values())


def _truncated(row: dict[str, Any]) -> float | None:
    t = row.get("truncation_rate")
    return None if t is None else sum(t.values())


def report(results: list[dict[str, Any]], out: Path, threshold: float) -> None:
    for res in results:
        print(f"\n== {res['label']}: policy versions to reach pass rate {threshold}: {res['steps_to_threshold']}")
        print(f"{'version':>7} {'trajs':>6} {'pass':>6} {'mean total':>10} {'dropped':>8} {'truncated':>9} {'zero-var':>8}")
        for r in res["rows"]:
            total = (r.get("total") or {}).get("mean")
            print(f"{r['key']:>7} {r['count']:>6} {_f(r.get('pass_rate')):>6} {_f(total):>10} {_f(_dropped(r)):>8} "
                  f"{_f(_truncated(r)):>9} {_f(r.get('zero_variance_fraction')):>8}")
    plot(results, out / "demo.png", threshold)
    (out / "demo.json").write_text(json.dumps(results, indent=1, default=str))
    print(f"\nplot: {out / 'demo.png'}   data: {out / 'demo.json'}")


def plot(results: list[dict[str, Any]], path: Path, threshold: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for res in results:
        xs = [int(r["key"]) for r in res["rows"]]
        ax1.plot(xs, [r.get("pass_rate") or 0 for r in res["rows"]], marker=".", label=res["label"])
        ax2.plot(xs, [_dropped(r) or 0 for r in res["rows"]], label=f"{res['label']}: groups dropped")
        ax2.plot(xs, [_truncated(r) or 0 for r in res["rows"]], linestyle="--", label=f"{res['label']}: truncated")
    ax1.axhline(threshold, color="grey", linewidth=0.8)
    ax1.set(xlabel="policy version that sampled the group", ylabel="mean outcome reward (pass rate)",
            title="letter-sum: learning", ylim=(0, 1.05))
    ax2.set(xlabel="policy version", ylabel="fraction", title="filter and truncation rates", ylim=(0, 1.05))
    ax1.legend()
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


AGENT_GROUP = "demo-agent"


def agent_stage(out: Path, startup_timeout: float = 120.0, episodes: int = 2) -> dict[str, Any]:
    """A group of ``episodes`` tool-using agent episodes through the session gateway: ``grpo-curator infer
    --tiny`` as the upstream, a service of its own (auth on) pointed at it, ``rollout.agent_example``'s loop
    per episode. Returns each episode's finish answer, its calls and the group's trajectories."""
    from rollout.agent_example import PROMPT, episode
    from service.client import CuratorClient

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "GRPO_CURATOR_DATABASE_URL")}
    env.update(GRPO_CURATOR_DATA_DIR=str(out / "state"), GRPO_CURATOR_LOG_LEVEL="warning",
               TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    keys = provision_local(out / "state", {"demo-admin": "admin", "demo-agent": "producer"})
    procs: list[subprocess.Popen] = []
    try:
        port = _free_port()
        procs.append(_spawn(["-m", "service.cli", "infer", "--tiny", "--port", str(port)], env, out / "infer.log"))
        env["GRPO_CURATOR_INFERENCE_URL"] = f"http://127.0.0.1:{port}/v1"
        url = start_service(out, env, procs, startup_timeout)
        _wait_upstream(f"http://127.0.0.1:{port}", procs[0], startup_timeout, out / "infer.log")
        with CuratorClient(url, api_key=keys["demo-agent"]) as curator:
            sessions = [curator.session(AGENT_GROUP, episodes, 0, prompt_id="agent-add", prompt=PROMPT)
                        for _ in range(episodes)]
            finished = [episode(curator, s) for s in sessions]
            calls = [curator.get_session(s)["calls"] for s in sessions]
        with CuratorClient(url, api_key=keys["demo-admin"]) as admin:
            group = admin.get_group(AGENT_GROUP, include_tokens=True)
    finally:
        stop_all(reversed(procs))
    result = {"group_id": AGENT_GROUP, "status": group["status"], "episodes": [
        {**done, "calls": c} for done, c in zip(finished, calls, strict=True)],
        "trajectories": [_agent_trajectory(t) for t in group["trajectories"]]}
    (out / "agent.json").write_text(json.dumps(result, indent=2))
    return result


def _agent_trajectory(t: dict[str, Any]) -> dict[str, Any]:
    parts = t.get("segments") or [t]
    masks = [m for p in parts for m in (p.get("loss_mask") or [])]
    return {"session_id": t["metadata"].get("session_id"), "finish_reason": t["finish_reason"],
            "tokens": len(masks), "trained_tokens": sum(masks), "segments": len(parts)}


def _wait_upstream(base: str, proc: subprocess.Popen, timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    with health_client(1) as http:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"grpo-curator infer exited; see {log}")
            try:
                if http.get(base + "/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
    raise RuntimeError(f"grpo-curator infer was not healthy in {timeout_s:g} s; see {log}")


def print_agent(result: dict[str, Any]) -> None:
    print(f"agent episodes through the gateway (group {result['group_id']}, {result['status']}):")
    by_session = {t["session_id"]: t for t in result["trajectories"]}
    for e in result["episodes"]:
        t = by_session.get(e["session_id"], {})
        answered = [c for c in e["calls"] if c["error"] is None]
        print(f"  session {e['session_id']}: {len(e['calls'])} calls ({len(answered)} answered), "
              f"finish {e['finish_reason']}, {t.get('tokens', 0)} tokens, {t.get('trained_tokens', 0)} trained")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="grpo-curator demo", description=__doc__.splitlines()[0])
    ap.add_argument("--no-curation", action="store_true", help="zero-variance filtering and truncation masking off")
    ap.add_argument("--compare", action="store_true", help="run with and without curation, one after the other")
    ap.add_argument("--versions", type=int, default=120, help="stop after this many policy versions")
    ap.add_argument("--minutes", type=float, default=8.0, help="stop after this long")
    ap.add_argument("--threshold", type=float, default=0.5, help="pass rate (10-version mean) that counts as learned")
    ap.add_argument("--truncation", choices=("penalize", "mask"), default="penalize",
                    help="what the curated run does with samples cut by the token budget: a -1 penalty (default; "
                         "the end of DAPO's overlong ramp) or the service's default, mask (which can stall: a masked "
                         "sample gives no gradient, so the policy is never pushed to stop)")
    ap.add_argument("--engine", choices=("transformers", "vllm"), default="transformers",
                    help="the producer's sampler: transformers generate, or vLLM's server (`make vllm`; it starts in "
                         "minutes on a CPU, so give --minutes room)")
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--groups-per-step", type=int, default=4)
    ap.add_argument("--out", default="demo-out")
    ap.add_argument("--startup-timeout", type=float, default=120.0, help="seconds to wait for the service to be healthy")
    ap.add_argument("--no-agent", action="store_true",
                    help="skip the closing tool-using agent episodes through the session gateway")
    args = ap.parse_args(argv)
    modes = [True, False] if args.compare else [not args.no_curation]
    results: list[dict[str, Any]] = []
    previous = signal.signal(signal.SIGINT, _on_sigint)
    try:
        for curated in modes:
            results.append(run_once(args, curated))
    except DemoInterrupted as exc:  # Ctrl-C: say so, and keep what the run had (table, plot, data)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the report short
        results.append(exc.partial)
        print("interrupted", file=sys.stderr, flush=True)
        report(results, Path(args.out), args.threshold)
        return 130
    finally:
        signal.signal(signal.SIGINT, previous)
    report(results, Path(args.out), args.threshold)
    if not args.no_agent:
        print_agent(agent_stage(Path(args.out) / "agent-episode", args.startup_timeout))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
