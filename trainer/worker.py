"""`grpo-curator train`: the GRPO trainer worker.

One loop: lease -> log-probs -> loss -> step -> publish -> checkpoint every `save_every` -> ack.
Under `torchrun` every rank leases its own batch (trainer id `<id>-rank<r>`); a rank that got
nothing trains on an empty micro-batch (zero loss mask, zero gradient) so the collectives line up,
and the loss denominators are global, so the update is that of the union of the ranks' batches.
Crash safety (trainer.delivery): a batch is acked only once a checkpoint holding its update is written;
until then a heartbeat keeps its lease alive, and after a crash it expires and is delivered again to the
resumed trainer. The checkpoint records which batches it holds (trainer.delivery.Ledger), so a crash
between the checkpoint and the ack is settled on resume (acked then; or, if the lease expired, the groups
are acked without training when they come back). Versions continue from the service's latest published
one (no 409 after a crash between publish and checkpoint). A batch the trainer cannot use is nacked with
its reason and ``drop`` (the service re-checks and drops only what really is untrainable).

Run: `python -m trainer.worker --config trainer.json --set loss.beta=0.04 --set lr=1e-6`,
or `torchrun --nproc-per-node 8 -m trainer.worker ...`; `--tiny` trains a tiny random model.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, get_args

import torch
from torch import nn

from filters.rules import staleness_version
from trainer import trackers
from trainer.checkpoint import (
    TrainerState,
    latest_checkpoint,
    load_model_weights,
    load_optimizer_state,
    load_trainer_state,
    save_checkpoint,
)
from trainer.delivery import (
    DeliveryClient,
    Heartbeat,
    Ledger,
    ack_batches,
    lease_batch,
    next_version,
    publish_version,
    refuse,
    unusable,
)
from trainer.logprobs import DEFAULT_CHUNK_TOKENS, HeadImpl
from trainer.loss import LossConfig, check_choice
from trainer.packing import MicroBatch, PackMode, pack_mini_batches
from trainer.parallel import DistContext, ParallelMode, all_reduce, barrier, init_distributed, wrap_policy
from trainer.policy import PolicyLogprobs, compile_decoder_layers
from trainer.step import StepConfig, train_step

log = logging.getLogger(__name__)


LeaseClient = DeliveryClient


@dataclass
class TrainerConfig:
    """Everything `grpo-curator train` needs. `model` (a transformers directory) or `model_config`
    (a config dict, or the path of a JSON config, with `model_type`) for a random-initialised model."""

    service_url: str | None = None  # None: --url, else GRPO_CURATOR_URL, else 127.0.0.1:GRPO_CURATOR_PORT (8000)
    trainer_id: str = "trainer"
    model: str | None = None
    model_config: dict[str, Any] | str | None = None
    seed: int = 0
    attn_implementation: str = "sdpa"
    lr: float = 1e-6
    weight_decay: float = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float | None = 1.0
    max_groups: int | None = None  # exactly one of the three sizes; none given: 8 groups
    max_trajectories: int | None = None
    max_tokens: int | None = None
    # "auto": 2 x save_every with a checkpoint_dir (groups from the newest or the previous checkpoint the
    # producers load; older ones are not leased), None without; None: no limit
    max_staleness: int | Literal["auto"] | None = "auto"
    min_groups: int | None = None  # wait (up to wait_seconds) for this many ready groups, then take what is there
    lease_seconds: float = 300.0
    wait_seconds: float = 5.0
    max_idle_polls: int | None = None  # stop after this many empty polls in a row (None: never)
    micro_token_budget: int = 8192
    pack_mode: PackMode = "pad"
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    head_impl: HeadImpl = "inplace"  # "compiled" on GPU fuses the LM-head softmax passes
    compile_layers: bool = False  # torch.compile each decoder layer
    temperature: float = 1.0  # for groups whose sampling.temperature is not given
    loss: LossConfig = field(default_factory=LossConfig)
    old_from_batch: bool = False  # recompute pi_old with the trainer's weights (see trainer.step.StepConfig)
    ppo_epochs: int = 1  # passes over each batch with pi_old fixed (see trainer.step.StepConfig)
    mini_batches: int = 1  # optimizer steps per pass (the batch's micro-batches split in this many)
    gradient_checkpointing: bool = False
    parallel: ParallelMode = "ddp"
    device: str = "auto"
    checkpoint_dir: str | None = None
    save_every: int = 10
    keep_checkpoints: int | None = 3
    initial_policy_version: int = 0

    def __post_init__(self) -> None:
        check_choice("pack_mode", self.pack_mode, get_args(PackMode))
        check_choice("parallel", self.parallel, get_args(ParallelMode))
        check_choice("head_impl", self.head_impl, get_args(HeadImpl))
        if (self.model is None) == (self.model_config is None):
            raise ValueError("give exactly one of model (a path) and model_config")
        sizes = [n for n in ("max_groups", "max_trajectories", "max_tokens") if getattr(self, n) is not None]
        if len(sizes) > 1:
            raise ValueError(f"give one of max_groups, max_trajectories, max_tokens, not {sizes}")
        if not sizes:
            self.max_groups = 8
        if isinstance(self.loss, dict):
            self.loss = LossConfig(**self.loss)
        if self.max_staleness == "auto":
            self.max_staleness = 2 * self.save_every if self.checkpoint_dir else None
        if self.max_staleness is not None and not (isinstance(self.max_staleness, int) and self.max_staleness >= 0):
            raise ValueError(f"max_staleness must be an int >= 0, 'auto' or None, got {self.max_staleness!r}")
        self.adam_betas = (float(self.adam_betas[0]), float(self.adam_betas[1]))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TrainerConfig:
        """Build from plain data (a JSON file); unknown keys raise ValueError listing valid ones."""
        valid = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - valid)
        if unknown:
            raise ValueError(f"unknown trainer config keys {unknown}; valid: {', '.join(sorted(valid))}")
        return cls(**raw)


def tiny_model_config(vocab_size: int = 256, hidden_size: int = 64, num_layers: int = 2) -> dict[str, Any]:
    """A tiny Qwen2-style config (for tests and demos; seconds to train on CPU)."""
    return {
        "model_type": "qwen2",
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
    }


def build_model(cfg: TrainerConfig) -> Any:
    """The policy's initial weights: `from_pretrained(cfg.model)`, or a model built from
    `cfg.model_config` with `torch.manual_seed(cfg.seed)` (the same weights every call). fp32 params."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if cfg.model is not None:
        return AutoModelForCausalLM.from_pretrained(
            cfg.model, dtype=torch.float32, attn_implementation=cfg.attn_implementation
        )
    raw = cfg.model_config
    if isinstance(raw, str):
        raw = json.loads(Path(raw).read_text())
    assert raw is not None
    params = dict(raw)
    config = AutoConfig.for_model(params.pop("model_type"), **params)
    torch.manual_seed(cfg.seed)
    return AutoModelForCausalLM.from_config(
        config, attn_implementation=cfg.attn_implementation, dtype=torch.float32
    )


def build_reference(cfg: TrainerConfig, ctx: DistContext) -> nn.Module | None:
    """The frozen reference (the initial weights, never a checkpoint); None when beta == 0.
    Sharded like the policy under FSDP; a full copy per rank under DDP."""
    if cfg.loss.beta == 0:
        return None
    ref = build_model(cfg).eval().requires_grad_(False)
    wrapped = PolicyLogprobs(ref, cfg.chunk_tokens, cfg.temperature, cfg.head_impl)
    return wrap_policy(wrapped, "fsdp", ctx) if _sharded(cfg, ctx) else wrapped.to(ctx.device)


def _sharded(cfg: TrainerConfig, ctx: DistContext) -> bool:
    """FSDP in use (each rank still builds the full model in CPU memory before sharding it)."""
    return cfg.parallel == "fsdp" and ctx.world_size > 1


def lease(client: LeaseClient, cfg: TrainerConfig, ctx: DistContext) -> dict[str, Any] | None:
    """This rank's batch (None when nothing was ready within `wait_seconds`)."""
    trainer_id = cfg.trainer_id if ctx.world_size == 1 else f"{cfg.trainer_id}-rank{ctx.rank}"
    return lease_batch(
        client,
        trainer_id,
        max_groups=cfg.max_groups,
        max_trajectories=cfg.max_trajectories,
        max_tokens=cfg.max_tokens,
        max_staleness=cfg.max_staleness,
        lease_seconds=cfg.lease_seconds,
        wait_seconds=cfg.wait_seconds,
        min_groups=cfg.min_groups,
        need_logprobs=cfg.old_from_batch,  # groups without behaviour log-probs stay for other trainers
    )


def usable(
    client: LeaseClient, batch: dict[str, Any] | None, cfg: TrainerConfig, vocab_size: int | None = None
) -> dict[str, Any] | None:
    """The batch, or None when it cannot be trained on (then it was nacked with its reason and dropped,
    and the reason logged: which group, which trajectory, which token)."""
    if batch is None:
        return None
    reason = unusable(batch, need_logprobs=cfg.old_from_batch, vocab_size=vocab_size)
    if reason is None:
        return batch
    offending = [g.get("id") for g in batch.get("groups", [])
                 if unusable({"groups": [g]}, need_logprobs=cfg.old_from_batch, vocab_size=vocab_size)]
    refuse(client, batch, reason, vocab_size, offending)  # logs it once: the groups dropped, the rest go back
    return None


def drop_nonfinite(client: LeaseClient, batch: dict[str, Any], ledger: Ledger, heartbeat: Heartbeat) -> None:
    """Nack (dropping its groups, with the reason) a batch whose loss or gradient norm was not finite."""
    refuse(client, batch, "loss or gradient norm not finite; the optimizer step was skipped")
    ledger.pending.pop(batch["batch_id"], None)
    heartbeat.release([batch["batch_id"]])


def ack_untrained(client: LeaseClient, batch: dict[str, Any], ledger: Ledger, heartbeat: Heartbeat) -> None:
    """Ack at once a batch that had nothing to train (no mask-1 token): no update depends on it, so it
    need not wait for a checkpoint (its lease would otherwise be held until the next one)."""
    ledger.pending.pop(batch["batch_id"], None)
    heartbeat.release([batch["batch_id"]])
    ack_batches(client, [batch["batch_id"]])


def ack(client: LeaseClient, ledger: Ledger, heartbeat: Heartbeat) -> bool:
    """Ack the pending batches (their updates are durable) and stop their heartbeat -> False if any was
    refused or had lost its lease (its groups are then remembered as trained: never trained again here)."""
    ids = list(ledger.pending)
    refused = ledger.settle(client, heartbeat.lost)
    heartbeat.release(ids)
    return refused == 0


def _ledger_state(ledger: Ledger, ctx: DistContext) -> dict[str, tuple]:
    """The ledger fields of the checkpoint: every rank's (a collective under torchrun)."""
    mine = ledger.saved()
    if ctx.world_size == 1:
        return mine
    parts: list[Any] = [None] * ctx.world_size
    torch.distributed.all_gather_object(parts, mine)
    return {"pending": tuple(p for part in parts for p in part["pending"]),
            "trained": tuple(dict.fromkeys(g for part in parts for g in part["trained"]))}


def durable(cfg: TrainerConfig, model: nn.Module, optimizer: torch.optim.Optimizer, state: TrainerState,
            ctx: DistContext, client: LeaseClient, ledger: Ledger, heartbeat: Heartbeat) -> TrainerState:
    """Checkpoint the weights with the ledger (which batches they hold), then ack those batches. A crash
    between the two is settled on resume: the checkpoint's pending batches are acked before any lease."""
    saved = _ledger_state(ledger, ctx)
    state = replace(state, pending=saved["pending"], trained=saved["trained"])
    checkpoint(cfg, model, optimizer, state, ctx)
    ack(client, ledger, heartbeat)
    return state


def _staleness_version(group: dict[str, Any]) -> int:
    """The leased group's oldest generated token's version (``filters.rules.staleness_version``): a member
    filled by an older policy, or tokens an earlier policy generated, count."""
    per = [s.get("versions") for t in group["trajectories"] for s in (t.get("segments") or [t])]
    return staleness_version(per, group["policy_version"])


def batch_stats(batch: dict[str, Any] | None, trained_version: int, device: torch.device) -> dict[str, float]:
    """Staleness (versions behind the weights trained, from each group's oldest generated token, as the
    service measures it) and size of the batches of all ranks."""
    versions = [_staleness_version(g) for g in batch["groups"]] if batch else []
    stale = torch.tensor(
        [
            sum(trained_version - v for v in versions),
            len(versions),
            sum(len(g["trajectories"]) for g in batch["groups"]) if batch else 0,
        ],
        dtype=torch.float64,
        device=device,
    )
    worst = torch.tensor(
        max((trained_version - v for v in versions), default=0), dtype=torch.float64, device=device
    )
    rewards = [t["total_reward"] for g in (batch or {}).get("groups", []) for t in g["trajectories"]
               if isinstance(t.get("total_reward"), int | float)]
    reward = torch.tensor([sum(rewards), len(rewards)], dtype=torch.float64, device=device)
    all_reduce(stale, "sum")
    all_reduce(worst, "max")
    all_reduce(reward, "sum")
    groups = float(stale[1])
    out = {
        "staleness_mean": float(stale[0]) / groups if groups else 0.0,
        "staleness_max": float(worst),
        "groups": groups,
        "trajectories": float(stale[2]),
    }
    if float(reward[1]):
        out["reward_mean"] = float(reward[0]) / float(reward[1])
    return out


def _setup(
    cfg: TrainerConfig,
) -> tuple[DistContext, Any, nn.Module, torch.optim.Optimizer, TrainerState]:
    """Process group, model (a transformers PreTrainedModel, resumed from the latest checkpoint), wrapped
    policy, AdamW, state."""
    ctx = init_distributed(cfg.device)
    model = build_model(cfg)
    ckpt = latest_checkpoint(cfg.checkpoint_dir)
    state = TrainerState(cfg.initial_policy_version, 0)
    if ckpt is not None:
        load_model_weights(ckpt, model)
        state = load_trainer_state(ckpt)
        log.info("resumed from %s at policy version %d", ckpt, state.policy_version)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not _sharded(cfg, ctx):  # fully_shard moves each rank's shards to the device itself
        model.to(ctx.device)
    if cfg.compile_layers:
        compile_decoder_layers(model)
    bare = PolicyLogprobs(model, cfg.chunk_tokens, cfg.temperature, cfg.head_impl)
    policy = wrap_policy(bare, cfg.parallel, ctx)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=cfg.adam_betas, weight_decay=cfg.weight_decay
    )
    if ckpt is not None:
        load_optimizer_state(ckpt, model, optimizer)
    return ctx, model, policy, optimizer, state


def micro_batches(batch: dict[str, Any] | None, cfg: TrainerConfig) -> list[list[MicroBatch]]:
    """This rank's `cfg.mini_batches` mini-batches of whole trajectories, each a list of micro-batches (one
    empty micro-batch for a mini-batch with nothing to train on, so every rank runs the same steps)."""
    return pack_mini_batches(batch, cfg.mini_batches, cfg.micro_token_budget, cfg.pack_mode, cfg.temperature)


def checkpoint(cfg: TrainerConfig, model: nn.Module, optimizer: torch.optim.Optimizer, state: TrainerState,
               ctx: DistContext) -> None:
    """Write the checkpoint (a collective under FSDP) and wait until it is complete on every rank."""
    assert cfg.checkpoint_dir is not None
    save_checkpoint(cfg.checkpoint_dir, model, optimizer, state, ctx.is_main, cfg.keep_checkpoints)
    barrier()


def _any_rank(flag: bool, ctx: DistContext) -> bool:
    """True when `flag` holds on at least one rank."""
    return int(all_reduce(torch.tensor(int(flag), device=ctx.device), "sum")) > 0


def _report(
    metrics: dict[str, float],
    batch: dict[str, Any] | None,
    version: int,
    seconds: float,
    acked: bool,
    ctx: DistContext,
) -> dict[str, float]:
    """Step metrics plus batch staleness / size, tokens per second and refused acks, over all ranks."""
    elapsed = float(all_reduce(torch.tensor(seconds, device=ctx.device), "max"))
    out = metrics | batch_stats(batch, version, ctx.device)
    out["tokens_per_s"] = metrics.get("input_tokens", 0.0) / max(elapsed, 1e-9)
    out["ack_refused"] = float(all_reduce(torch.tensor(int(not acked), device=ctx.device), "sum"))
    return out


def progress_line(version: int, metrics: dict[str, float]) -> str:
    """One console line per update: version, loss, batch reward, throughput, how long the lease waited."""
    reward = metrics.get("reward_mean")
    parts = [
        f"v{version}",
        f"loss {metrics.get('loss', float('nan')):+.4f}",
        f"reward {reward:.3f}" if reward is not None else "reward -",
        f"groups {int(metrics.get('groups', 0))}",
        f"tokens/s {metrics.get('tokens_per_s', 0.0):,.0f}",
        f"lease wait {metrics.get('lease_wait_s', 0.0):.2f}s",
    ]
    if metrics.get("updates", 1.0) != 1.0:
        parts.append(f"updates {int(metrics['updates'])}")
    return "[train] " + "  ".join(parts)


def publish(client: LeaseClient, state: TrainerState, metrics: dict[str, float], ctx: DistContext) -> None:
    """Rank 0 publishes the new policy version once every rank has stepped, and prints its line."""
    barrier()
    if ctx.is_main:
        publish_version(client, state.policy_version, metrics)
        rounded = {k: round(v, 6) for k, v in metrics.items()}
        log.debug("policy version %d: %s", state.policy_version, json.dumps(rounded))
        print(progress_line(state.policy_version, metrics), flush=True)


def run(cfg: TrainerConfig, client: LeaseClient, max_steps: int | None = None) -> list[dict[str, float]]:
    """Train until `max_steps` updates (None: forever, or until `max_idle_polls` empty polls in a row).

    -> the metrics published for each update.
    """
    ctx, model, policy, optimizer, state = _setup(cfg)
    vocab_size = int(model.get_input_embeddings().num_embeddings)
    state = replace(state, policy_version=next_version(client, state.policy_version))
    ref = build_reference(cfg, ctx)
    tracked = trackers.from_env(asdict(cfg)) if ctx.is_main else trackers.Trackers([])  # W&B / MLflow / TB
    step_cfg = StepConfig(cfg.loss, cfg.max_grad_norm, cfg.old_from_batch,
                          ppo_epochs=cfg.ppo_epochs, mini_batches=cfg.mini_batches)
    history: list[dict[str, float]] = []
    ledger = Ledger(state.pending, state.trained)  # what the checkpoint holds that the service may not know
    idle = 0
    with Heartbeat(client, cfg.lease_seconds) as heartbeat:
        ledger.settle(client)  # a crash between the last checkpoint and its ack: ack now (or remember)
        while max_steps is None or len(history) < max_steps:
            t_lease = time.perf_counter()
            batch = usable(client, ledger.strip(client, lease(client, cfg, ctx)), cfg, vocab_size)  # lease
            lease_wait = time.perf_counter() - t_lease
            if not _any_rank(batch is not None, ctx):
                idle += 1
                if cfg.max_idle_polls is not None and idle >= cfg.max_idle_polls:
                    break
                continue
            if batch is not None:
                heartbeat.hold(batch["batch_id"])
                ledger.add(batch)
            idle, t0 = 0, time.perf_counter()
            mbs = micro_batches(batch, cfg)
            metrics = train_step(policy, optimizer, mbs, step_cfg, ref)  # log-probs -> loss -> step
            seconds = time.perf_counter() - t0
            if metrics["skipped"] and batch is not None:  # no update applied
                if metrics.get("nonfinite"):  # not stepped; would poison every trainer
                    drop_nonfinite(client, batch, ledger, heartbeat)
                else:  # nothing to train: acked now, whether or not a checkpoint is due
                    ack_untrained(client, batch, ledger, heartbeat)
            # some updates applied before a non-finite one (nonfinite_updates): the batch was trained, acked
            acked = ack(client, ledger, heartbeat) if not cfg.checkpoint_dir else True  # nothing is durable
            metrics = _report(metrics, batch, state.policy_version, seconds, acked, ctx)
            metrics["lease_wait_s"] = lease_wait
            if metrics["skipped"]:
                continue
            state = replace(state, policy_version=state.policy_version + 1, step=state.step + 1)
            publish(client, state, metrics, ctx)  # publish
            tracked.log_step(state.step, metrics, batch)
            history.append(metrics)
            if cfg.checkpoint_dir and state.step % cfg.save_every == 0:
                state = durable(cfg, model, optimizer, state, ctx, client, ledger, heartbeat)  # checkpoint, ack
        if cfg.checkpoint_dir and _any_rank(bool(ledger.pending), ctx):  # every rank decides alike (a collective)
            durable(cfg, model, optimizer, state, ctx, client, ledger, heartbeat)
    return history


def _parse_set(items: list[str]) -> dict[str, Any]:
    """["a=1", "loss.beta=0.04"] -> {"a": 1, "loss": {"beta": 0.04}} (values parsed as JSON when they can be)."""
    out: dict[str, Any] = {}
    for item in items:
        key, _, raw = item.partition("=")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        *parents, leaf = key.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def config_help() -> str:
    """The config fields with their defaults, for --help (set them in --config JSON or with --set)."""
    lines = ["config fields (JSON --config file, or --set KEY=VALUE; loss.* are LossConfig fields):"]
    for f in fields(TrainerConfig):
        if f.name == "loss":
            continue
        default = f.default_factory() if f.default_factory is not MISSING else f.default  # type: ignore[misc]
        lines.append(f"  {f.name:<24} default {json.dumps(default, default=str)}")
    for f in fields(LossConfig):
        lines.append(f"  loss.{f.name:<19} default {json.dumps(f.default, default=str)}")
    lines.append("see docs/training.md for what each one does")
    return "\n".join(lines)


def config_from_args(argv: list[str] | None = None) -> tuple[TrainerConfig, int | None]:
    """Command line -> (TrainerConfig, max_steps); ``service_url`` resolved (``--url``, the config's, then
    the environment: ``service.client.resolve_connection``, every command's one client configuration)."""
    from service.cli.connection import add_client_options, connection
    ap = argparse.ArgumentParser(
        prog="grpo-curator train",
        description=__doc__.splitlines()[0],
        epilog=config_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--config", help="JSON file with TrainerConfig fields")
    ap.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a field (loss.beta=0.04)"
    )
    ap.add_argument("--tiny", action="store_true", help="train a tiny random-initialised Qwen2 model")
    ap.add_argument("--max-steps", type=int, default=None)
    add_client_options(ap)
    args = ap.parse_args(argv)
    raw: dict[str, Any] = json.loads(Path(args.config).read_text()) if args.config else {}
    for key, value in _parse_set(args.set).items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    if args.tiny:
        raw.setdefault("model_config", tiny_model_config())
    args.url = args.url or raw.get("service_url")
    raw["service_url"] = connection(args).url
    return TrainerConfig.from_dict(raw), args.max_steps


def main(argv: list[str] | None = None) -> int:
    """Entry point of `grpo-curator train` / `python -m trainer.worker`."""
    from service.cli.connection import api_key_of
    from service.client import CuratorClient

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg, max_steps = config_from_args(argv)
    assert cfg.service_url is not None  # config_from_args resolves it (--url, the config's, the environment)
    client = CuratorClient(cfg.service_url, api_key=api_key_of(argv))  # kept out of TrainerConfig (logged)
    history = run(cfg, client, max_steps)
    print(f"[train] stopped after {len(history)} updates", flush=True)
    log.info("config %s", json.dumps(asdict(cfg), default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
