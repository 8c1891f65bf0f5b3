"""``grpo-curator rollout``: the rollout producer.

Loop: read the current policy (the latest trainer checkpoint, its version checked against
``GET /v1/policy``) -> take sampling requests (``GET /v1/sampling/requests``) -> sample a group per
request with vLLM's server (``backend: vllm``; ``auto`` when its virtualenv is installed and a GPU
is there), else transformers ``generate`` -> post the groups
with their policy version -> mark the requests done. A resample / resume request that names a group's slot
(``group_id``, ``index``) is answered in place instead: one replacement trajectory, posted to
``POST /v1/groups/{group_id}/trajectories/{index}`` (a resume continues its checkpoint's episode). Group ids are derived from the run, the request
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

from rollout.episodes import continue_episode, multi_turn, single_turn
from rollout.sampler import (
    HFSampler,
    Sampler,
    SamplingEnvError,
    ServerGone,
    VLLMSampler,
    stable_seed,
    vllm_available,
)
from rollout.tasks import TOOLS, load_tokenizer, render_prompt
from trainer.checkpoint import load_trainer_state
from trainer.checkpoint_readers import read_latest

log = logging.getLogger(__name__)


@dataclass
class RolloutConfig:
    service_url: str | None = None  # None: --url, else GRPO_CURATOR_URL, else 127.0.0.1:GRPO_CURATOR_PORT (8000)
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
    vllm_url: str | None = None  # backend vllm: a vLLM server someone else runs (serving `model`); else one is started
    # vllm_url only: its operator verified that their vLLM's reload_weights serves a checkpoint's weights (vLLM
    # 0.32's CPU build was measured serving wrong ones): without it a new checkpoint is refused, not reloaded
    vllm_url_in_place_reload: bool = False
    # the producer's own vLLM server's context (prompt + completion tokens); None: the model's
    # max_position_embeddings. On a CPU with a long-context model, lower it to what VLLM_CPU_KVCACHE_SPACE holds
    vllm_max_model_len: int | None = None

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
        against the trainer's pruning while it loads. The vLLM sampler loads it (``VLLMSampler.load``: its own
        server restarted on it); a transformers sampler is closed and rebuilt."""
        with read_latest(self.cfg.checkpoint_dir) as ckpt:
            if self.sampler is not None and ckpt == self.checkpoint:
                return False
            version = load_trainer_state(ckpt).policy_version if ckpt else 0
            if isinstance(self.sampler, VLLMSampler) and ckpt is not None:
                self.sampler.load(ckpt)
            else:
                if self.sampler is not None:
                    self.sampler.close()
                    self.sampler = None
                self.sampler = self._build(ckpt)
        self.checkpoint, self.version = ckpt, version
        log.info("producer %s: sampling with policy version %d (%s)", self.cfg.producer_id, version, ckpt or "initial")
        return True

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.close()
            self.sampler = None

    def _build(self, ckpt: Path | None) -> Sampler:
        eos = self.tokenizer.eos_token_id
        use_vllm = self.cfg.backend == "vllm" or (self.cfg.backend == "auto" and vllm_available())
        weights = ckpt or self.cfg.model  # a directory vLLM / from_pretrained can read, else a config
        if use_vllm:
            return self._vllm(ckpt, eos)
        from transformers import AutoModelForCausalLM

        if weights is not None:
            model = AutoModelForCausalLM.from_pretrained(str(weights))
        else:
            model = self._initial_model()
        self._check_eos(eos, model.config.vocab_size, weights)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos
        return HFSampler(model, eos, pad, self.cfg.temperature, self.cfg.device)

    def _check_eos(self, eos: Any, vocab_size: int | None, weights: Any) -> None:
        """The tokenizer's EOS must be a token the model can sample: else no completion ever stops (vLLM's
        stop_token_ids, generate's eos_token_id name a token that never comes)."""
        if not isinstance(eos, int) or isinstance(eos, bool):
            raise ValueError(f"tokenizer {self.cfg.tokenizer!r} has no EOS token id (got {eos!r})")
        if vocab_size is not None and not 0 <= eos < int(vocab_size):
            raise ValueError(f"tokenizer {self.cfg.tokenizer!r}: EOS id {eos} is outside the model's vocabulary "
                             f"({vocab_size} ids, {weights or 'model_config'}): tokenizer and model do not match")

    def _initial_model(self) -> Any:
        from trainer.worker import TrainerConfig, build_model

        return build_model(TrainerConfig(model_config=self.cfg.model_config, seed=self.cfg.seed))

    def _vllm(self, ckpt: Path | None, eos: int) -> VLLMSampler:
        weights: str | Path | None = ckpt or self.cfg.model
        if weights is not None:
            self._check_eos(eos, _vocab_size(weights), weights)
        if self.cfg.vllm_url:  # serving `model`; a checkpoint is reloaded in place only when verified (load)
            sampler = VLLMSampler(self.cfg.vllm_url, eos, self.cfg.temperature,
                                  in_place_reload=self.cfg.vllm_url_in_place_reload)
            if ckpt is not None:
                sampler.load(ckpt)
            return sampler
        spool = Path(self.cfg.spool_dir) / self.cfg.producer_id
        if weights is None:  # the trainer's initial weights (model_config + seed), saved where vLLM can read them
            weights = spool.parent / f".{self.cfg.producer_id}-initial"
            model = self._initial_model()
            self._check_eos(eos, model.config.vocab_size, "model_config")
            model.save_pretrained(weights)
        return VLLMSampler.start(weights, eos, self.cfg.temperature, max_model_len=self.cfg.vllm_max_model_len,
                                 log_path=spool.parent / f".{self.cfg.producer_id}-vllm.log")

    def sampling_failed(self, exc: SamplingEnvError) -> None:
        """After an environment failure: a server of the producer's own that went away is dropped, and the
        next ``refresh`` starts a fresh one (a server someone else runs is theirs to bring back)."""
        if isinstance(exc, ServerGone) and isinstance(self.sampler, VLLMSampler) and self.sampler.server is not None:
            self.sampler.close()
            self.sampler = None


def _vocab_size(weights: str | Path) -> int | None:
    try:
        config = json.loads((Path(weights) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return int(size) if size else None


def fit_budget(sampler: Any, prompt_len: int, max_tokens: int) -> int:
    """``max_tokens``, or what the sampler's context leaves after the prompt (logged: the group records the
    budget it was really sampled with); PromptTooLong (a SamplingEnvError) when nothing is left."""
    budget = getattr(sampler, "budget", None)
    fitted = budget(prompt_len, max_tokens) if budget is not None else max_tokens
    if fitted < max_tokens:
        log.warning("prompt of %d tokens leaves %d of max_tokens %d in the sampler's context", prompt_len, fitted,
                    max_tokens)
    return fitted


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
    max_tokens = fit_budget(policy.sampler, len(ids), max_tokens)
    trajectories = _sample(policy, cfg, ids, n, max_tokens, seed)
    return {"id": group_id, "prompt_id": request["prompt_id"], "policy_version": policy.version,
            "sampling": {"temperature": cfg.temperature, "max_tokens": max_tokens, "n": n},
            "metadata": {"producer": cfg.producer_id, "request_id": request["request_id"], "reason": request.get("reason")},
            "trajectories": trajectories}


def _sample(policy: Policy, cfg: RolloutConfig, ids: list[int], n: int, max_tokens: int, seed: int) -> list[dict[str, Any]]:
    """n trajectories for the rendered prompt ``ids`` under the current policy."""
    assert policy.sampler is not None
    if cfg.max_turns > 1:
        return [multi_turn(policy.sampler, policy.tokenizer, ids, tools=TOOLS, max_turns=cfg.max_turns,
                           max_tokens=max_tokens, seed=seed + 1000 * i, version=policy.version) for i in range(n)]
    completions = policy.sampler.sample(ids, n, max_tokens, seed)
    eos = policy.tokenizer.eos_token_id
    return [single_turn(ids, c, policy.tokenizer.decode([t for t in c.tokens if t != eos]), policy.version)
            for c in completions]


def build_replacement(policy: Policy, request: dict[str, Any], cfg: RolloutConfig) -> dict[str, Any]:
    """The body that fills a resample / resume request's slot (``POST /v1/groups/{id}/trajectories/{i}``):
    a resample samples one new trajectory of the prompt with the larger budget; a resume continues the
    episode from the request's checkpoint under the current policy (no tool of the checkpoint runs again)."""
    budget = request.get("budget") or {}
    max_tokens = int(budget.get("max_tokens") or cfg.max_tokens)
    seed = stable_seed(f"{cfg.run_id}-{request['request_id']}-{request['group_id']}-{request['index']}-v{policy.version}")
    assert policy.sampler is not None
    if request["reason"] == "resume":
        trajectory = continue_episode(policy.sampler, policy.tokenizer, request["checkpoint"], tools=TOOLS,
                                      max_turns=cfg.max_turns, max_tokens=max_tokens, seed=seed,
                                      version=policy.version)
    else:
        ids = render_prompt(policy.tokenizer, request["prompt"]["messages"])
        [trajectory] = _sample(policy, cfg, ids, 1, fit_budget(policy.sampler, len(ids), max_tokens), seed)
    trajectory.setdefault("metadata", {})["producer"] = cfg.producer_id
    return {"policy_version": policy.version, "trajectory": trajectory}


def fill_slots(client: Any, policy: Policy, requests: list[dict[str, Any]], cfg: RolloutConfig) -> int:
    """Serve the requests that fill a group's slot; returns how many the service took. A slot that is no
    longer awaited (its deadline passed, another producer filled it) is a 409: logged and skipped. A fill the
    service refuses (any other 4xx but 429) is logged naming the group, the slot and the field, and its
    request is marked done at once: never the producer's death, never offered again (the group's deadline
    then trains it without that slot)."""
    from service.client import CuratorError

    filled = 0
    for r in requests:
        try:
            body = build_replacement(policy, r, cfg)
        except SamplingEnvError as exc:
            skipped(policy, r, exc)
            continue
        try:
            client.fill_slot(r["group_id"], r["index"], body["policy_version"], body["trajectory"], r.get("request_id"))
        except CuratorError as exc:
            if exc.status_code == 409:
                log.info("slot %s/%s no longer awaited: %s", r["group_id"], r["index"], exc.message)
            elif refused(exc):
                release_refused(client, r, exc)
            else:
                raise
            continue
        filled += 1
    return filled


def refused(exc: Any) -> bool:
    """The service refused the body itself (a 4xx other than a conflict or a rate limit): sending it again
    cannot help."""
    return 400 <= exc.status_code < 500 and exc.status_code not in (409, 429)


def release_refused(client: Any, request: dict[str, Any], exc: Any) -> None:
    """Log a refused fill (group, slot, reason, the field the service named) and mark its request done."""
    field = exc.message.split(":", 1)[0] if ":" in exc.message else "-"
    log.error("fill of group %s slot %s (%s request %s) refused with %d on field %s: %s; request released",
              request["group_id"], request["index"], request.get("reason"), request.get("request_id"),
              exc.status_code, field, exc.message)
    client.sampling_done([request["request_id"]])


def skipped(policy: Policy, request: dict[str, Any], exc: SamplingEnvError) -> None:
    """A request whose sampling failed for the environment's reasons (a prompt too long for the server, a
    server that went away): logged and skipped (marked done with the rest), never the producer's death."""
    log.error("request %s (prompt %s): sampling failed, skipped: %s: %s", request.get("request_id"),
              request.get("prompt_id"), type(exc).__name__, exc)
    policy.sampling_failed(exc)
    if policy.sampler is None:
        policy.refresh()  # a fresh server before the next request of the batch


def build_groups(policy: Policy, requests: list[dict[str, Any]], cfg: RolloutConfig) -> list[dict[str, Any]]:
    """One group per request; a request whose sampling failed for the environment's reasons is skipped."""
    groups = []
    for r in requests:
        try:
            groups.append(build_group(policy, r, cfg))
        except SamplingEnvError as exc:
            skipped(policy, r, exc)
    return groups


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
    try:
        return _loop(cfg, client, policy, spool, posted, max_groups, stop)
    finally:
        policy.close()  # a vLLM server the producer started stops with it


def _loop(cfg: RolloutConfig, client: Any, policy: Policy, spool: Spool, posted: int, max_groups: int | None,
          stop: threading.Event) -> int:
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
        slots = [r for r in requests if r.get("group_id") is not None]
        fill_slots(client, policy, slots, cfg)
        groups = build_groups(policy, [r for r in requests if r.get("group_id") is None], cfg)
        for g in groups:
            spool.put(g)
        posted += post_spooled(client, spool, groups) + len(slots)
        client.sampling_done([r["request_id"] for r in requests])
    return posted


def config_from_args(argv: list[str] | None) -> tuple[RolloutConfig, int | None]:
    from service.cli.connection import add_client_options, connection

    ap = argparse.ArgumentParser(prog="grpo-curator rollout", description=__doc__.splitlines()[0])
    add_client_options(ap)  # the one client configuration (service.client.resolve_connection)
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
    args.url = args.url or raw.get("service_url")
    raw["service_url"] = connection(args).url
    return RolloutConfig.from_dict(raw), args.max_groups


def main(argv: list[str] | None = None) -> int:
    from service.client import CuratorClient

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg, max_groups = config_from_args(argv)
    stop = threading.Event()
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    from service.cli.connection import api_key_of

    assert cfg.service_url is not None  # config_from_args resolves it (--url, the config's, the environment)
    with CuratorClient(cfg.service_url, api_key=api_key_of(argv)) as client:
        posted = run(cfg, client, max_groups=max_groups, stop=stop)
    log.info("producer %s posted %d groups", cfg.producer_id, posted)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
