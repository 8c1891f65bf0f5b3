"""``grpo-curator rollout``: the rollout producer.

Loop: read the current policy (the latest trainer checkpoint, its version checked against
``GET /v1/policy``) -> take sampling requests (``GET /v1/sampling/requests``) -> sample a group per
request with vLLM when installed (and a GPU is there), else transformers ``generate`` -> post the groups
with their policy version -> mark the requests done. Group ids are derived from the run, the request
and the policy version, and every body is written to a spool directory before it is posted and
removed only after the service acknowledged it: a producer restarted after a crash re-posts the same
ids with the same bodies, which the service answers 200 without storing anything twice.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import threading
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from rollout.episodes import multi_turn, single_turn
from rollout.sampler import HFSampler, Sampler, VLLMSampler, stable_seed, vllm_available
from rollout.tasks import TOOLS, load_tokenizer, render_prompt
from trainer.checkpoint import load_trainer_state
from trainer.checkpoint_readers import read_latest

log = logging.getLogger(__name__)


@dataclass
class RolloutConfig:
    service_url: str = "http://127.0.0.1:8000"
    producer_id: str = "producer"
    run_id: str = "run"
    model: str | None = None  # a transformers directory; else model_config + seed (as the trainer)
    model_config: dict[str, Any] | str | None = None
    seed: int = 0
    tokenizer: str = "char:abcd="
    checkpoint_dir: str | None = None
    dataset: str | None = None
    group_size: int = 8
    max_tokens: int = 16
    temperature: float = 1.0
    requests_per_poll: int = 4
    max_turns: int = 1  # > 1: multi-turn episodes with the tool registry
    spool_dir: str = ".grpo-curator/spool"
    poll_seconds: float = 0.5
    max_backlog: int | None = None  # pause while this many groups wait to be scored or trained on
    backend: str = "auto"  # auto | hf | vllm
    device: str = "cpu"

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> RolloutConfig:
        valid = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - valid)
        if unknown:
            raise ValueError(f"unknown rollout config keys {unknown}; valid: {', '.join(sorted(valid))}")
        return cls(**raw)


class Spool:
    """Write-ahead directory of group bodies not yet acknowledged by the service."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def put(self, group: dict[str, Any]) -> None:
        tmp = self.root / f".{group['id']}.tmp"
        tmp.write_text(json.dumps(group))
        os.replace(tmp, self.root / f"{group['id']}.json")

    def remove(self, group_id: str) -> None:
        (self.root / f"{group_id}.json").unlink(missing_ok=True)

    def pending(self) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted(self.root.glob("*.json"))]


@dataclass
class Policy:
    """The weights the producer samples with, and their policy version."""

    cfg: RolloutConfig
    tokenizer: Any
    version: int = -1
    checkpoint: Path | None = None
    sampler: Sampler | None = field(default=None, repr=False)

    def refresh(self) -> bool:
        """Load the latest checkpoint when there is a newer one (or the initial weights once), holding it
        against the trainer's pruning while it loads; the old sampler is closed first (frees its engine)."""
        with read_latest(self.cfg.checkpoint_dir) as ckpt:
            if self.sampler is not None and ckpt == self.checkpoint:
                return False
            version = load_trainer_state(ckpt).policy_version if ckpt else 0
            if self.sampler is not None:
                self.sampler.close()
                self.sampler = None
            self.sampler = self._build(ckpt)
        self.checkpoint, self.version = ckpt, version
        log.info("producer %s: sampling with policy version %d (%s)", self.cfg.producer_id, version, ckpt or "initial")
        return True

    def _build(self, ckpt: Path | None) -> Sampler:
        eos = self.tokenizer.eos_token_id
        use_vllm = self.cfg.backend == "vllm" or (self.cfg.backend == "auto" and vllm_available())
        weights = ckpt or self.cfg.model  # a directory vLLM / from_pretrained can read, else a config
        if use_vllm and weights is not None:
            return VLLMSampler(weights, eos, self.cfg.temperature)
        from transformers import AutoModelForCausalLM

        if weights is not None:
            model = AutoModelForCausalLM.from_pretrained(str(weights))
        else:
            from trainer.worker import TrainerConfig, build_model

            model = build_model(TrainerConfig(model_config=self.cfg.model_config, seed=self.cfg.seed))
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos
        return HFSampler(model, eos, pad, self.cfg.temperature, self.cfg.device)


def build_group(policy: Policy, request: dict[str, Any], cfg: RolloutConfig) -> dict[str, Any]:
    """Sample one group for a sampling request (deterministic given the group id)."""
    prompt = request["prompt"]
    budget = request.get("budget") or {}
    max_tokens = int(budget.get("max_tokens") or cfg.max_tokens)
    n = max(cfg.group_size, int(request.get("n") or 0))
    group_id = f"{cfg.run_id}-{request['request_id']}-v{policy.version}"
    seed = stable_seed(group_id)
    ids = render_prompt(policy.tokenizer, prompt["messages"])
    assert policy.sampler is not None
    if cfg.max_turns > 1:
        trajectories = [multi_turn(policy.sampler, policy.tokenizer, ids, tools=TOOLS, max_turns=cfg.max_turns,
                                   max_tokens=max_tokens, seed=seed + 1000 * i) for i in range(n)]
    else:
        completions = policy.sampler.sample(ids, n, max_tokens, seed)
        eos = policy.tokenizer.eos_token_id
        trajectories = [single_turn(ids, c, policy.tokenizer.decode([t for t in c.tokens if t != eos])) for c in completions]
    return {"id": group_id, "prompt_id": request["prompt_id"], "policy_version": policy.version,
            "sampling": {"temperature": cfg.temperature, "max_tokens": max_tokens, "n": n},
            "metadata": {"producer": cfg.producer_id, "request_id": request["request_id"], "reason": request.get("reason")},
            "trajectories": trajectories}


def post_spooled(client: Any, spool: Spool, groups: list[dict[str, Any]]) -> int:
    """Post groups that are already in the spool; unspool what the service acknowledged."""
    from service.client import CuratorError

    if not groups:
        return 0
    try:
        client.post_groups(groups)
    except CuratorError as exc:
        if exc.status_code != 409:
            raise
        for g in groups:  # one conflicting id fails the batch: post one by one to isolate it
            try:
                client.post_group(g)
            except CuratorError as one:
                if one.status_code != 409:
                    raise
                log.error("group %s conflicts with a different stored body; dropping it: %s", g["id"], one.message)
            spool.remove(g["id"])
        return len(groups)
    for g in groups:
        spool.remove(g["id"])
    return len(groups)


def backlog(client: Any, dataset: str | None = None) -> int:
    """Groups of ``dataset`` waiting for the worker or the trainer: producing far ahead of the trainer only
    makes stale data. Passing the dataset also lets a key scoped to it read the counts."""
    counts = client.summary(dataset)["groups"]
    return sum(counts.get(s, 0) for s in ("received", "scored", "ready"))


def run(cfg: RolloutConfig, client: Any, *, max_groups: int | None = None, stop: threading.Event | None = None) -> int:
    """Produce until ``stop`` is set or ``max_groups`` groups were posted; returns the number posted."""
    stop = stop or threading.Event()
    tokenizer = load_tokenizer(cfg.tokenizer)
    spool = Spool(Path(cfg.spool_dir) / cfg.producer_id)
    posted = post_spooled(client, spool, spool.pending())  # a restart re-posts what a crash left behind
    policy = Policy(cfg, tokenizer)
    while not stop.is_set() and (max_groups is None or posted < max_groups):
        policy.refresh()
        if cfg.max_backlog is not None and backlog(client, cfg.dataset) >= cfg.max_backlog:
            stop.wait(cfg.poll_seconds)
            continue
        want = cfg.requests_per_poll if max_groups is None else min(cfg.requests_per_poll, max_groups - posted)
        requests = client.sampling_requests(n=want, producer_id=cfg.producer_id, dataset=cfg.dataset,
                                            group_size=cfg.group_size)
        if not requests:
            stop.wait(cfg.poll_seconds)
            continue
        groups = [build_group(policy, r, cfg) for r in requests]
        for g in groups:
            spool.put(g)
        posted += post_spooled(client, spool, groups)
        client.sampling_done([r["request_id"] for r in requests])
    return posted


def config_from_args(argv: list[str] | None) -> tuple[RolloutConfig, int | None]:
    ap = argparse.ArgumentParser(prog="grpo-curator rollout", description=__doc__.splitlines()[0])
    ap.add_argument("--config", help="JSON file with RolloutConfig fields")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--max-groups", type=int)
    args = ap.parse_args(argv)
    raw: dict[str, Any] = json.loads(Path(args.config).read_text()) if args.config else {}
    for item in args.set:
        key, _, value = item.partition("=")
        try:
            raw[key] = json.loads(value)
        except json.JSONDecodeError:
            raw[key] = value
    return RolloutConfig.from_dict(raw), args.max_groups


def main(argv: list[str] | None = None) -> int:
    from service.client import CuratorClient

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg, max_groups = config_from_args(argv)
    stop = threading.Event()
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with CuratorClient(cfg.service_url) as client:
        posted = run(cfg, client, max_groups=max_groups, stop=stop)
    log.info("producer %s posted %d groups", cfg.producer_id, posted)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
