"""Data parallelism for the trainer: process-group setup, DDP / FSDP wrapping, small collectives.

Every collective here is a no-op when torch.distributed is not initialised, so the same step code
runs in one process and under `torchrun`. Each rank leases its own batch; gradients are averaged
across ranks by DDP (or reduce-scattered by FSDP), which is why loss denominators are divided by
the world size (see `trainer.step.global_denominator`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, get_args

import torch
import torch.distributed as dist
from torch import Tensor, nn

from trainer.loss import check_choice
from trainer.policy import decoder_layers

ParallelMode = Literal["ddp", "fsdp"]


@dataclass(frozen=True)
class DistContext:
    """Where this process sits: rank, world size and its device."""

    rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str = "auto") -> DistContext:
    """Initialise the process group when launched by torchrun (WORLD_SIZE > 1).

    device "auto": cuda:LOCAL_RANK when CUDA is available, else cpu. Backend nccl on CUDA, gloo on CPU.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "auto":
        device = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    if dist.is_initialized():
        return DistContext(rank=dist.get_rank(), world_size=dist.get_world_size(), device=dev)
    return DistContext(rank=0, world_size=1, device=dev)


def world_size() -> int:
    """Number of data-parallel ranks (1 without a process group)."""
    return dist.get_world_size() if dist.is_initialized() else 1


def all_reduce(t: Tensor, op: str = "sum") -> Tensor:
    """In-place all-reduce (sum | max | min) across ranks; returns `t`. No-op in one process."""
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    check_choice("reduce op", op, tuple(ops))
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=ops[op])
    return t


def barrier() -> None:
    """Wait for every rank (no-op in one process)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def wrap_policy(policy: nn.Module, mode: str, ctx: DistContext) -> nn.Module:
    """Wrap the policy for data parallelism; returned unchanged in one process.

    ddp: DistributedDataParallel without buffer broadcasts (ranks may run different numbers of
    forwards: old-policy / reference passes and micro-batch counts differ per rank).
    fsdp: FSDP2 `fully_shard` on every decoder layer, then on the whole policy.
    """
    check_choice("parallel mode", mode, get_args(ParallelMode))
    if ctx.world_size == 1:
        return policy
    if mode == "ddp":
        ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(policy, device_ids=ids, broadcast_buffers=False)
    from torch.distributed.fsdp import fully_shard

    for layer in decoder_layers(policy):
        fully_shard(layer)
    fully_shard(policy)
    return policy


def unwrap(policy: nn.Module) -> nn.Module:
    """The module under a DDP wrapper (FSDP2 shards in place, so it is its own module)."""
    return policy.module if isinstance(policy, nn.parallel.DistributedDataParallel) else policy


@contextlib.contextmanager
def grad_sync(policy: nn.Module, sync: bool) -> Iterator[None]:
    """Context for one micro-batch's backward: gradients are synchronised only when `sync`."""
    if isinstance(policy, nn.parallel.DistributedDataParallel) and not sync:
        with policy.no_sync():
            yield
        return
    setter = getattr(policy, "set_requires_gradient_sync", None)  # FSDP2
    if setter is not None:
        setter(sync)
    yield
