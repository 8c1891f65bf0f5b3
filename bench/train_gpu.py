"""GRPO update throughput on one GPU: the trainer's path beside the plain transformers update.

Random-initialised Qwen2-shaped models (the 0.5B and 1.5B configs; nothing is downloaded) train on a
synthetic leased batch (default 512 sequences x 1,024 tokens, groups of 8, prompts of 64-256 tokens
with loss mask 0). One step = one GRPO update over the whole batch: a no-grad old-policy forward
(as in the reference numbers below), the clipped token-mean loss, backward, grad clip, AdamW.

Variants, same batch, same run:
- plain: `model(...).logits`, a full fp32 log_softmax over the vocabulary, fixed rows per
  micro-batch, no packing -- the update written plainly (the baseline).
- fused: `trainer.step.train_step`: the LM head fused with the log-prob in chunks under autograd
  (full logits never exist), length-sorted micro-batches under a token budget.
- fused+compile: the same, every decoder layer compiled and the head's softmax passes compiled.
Reported: update tokens/s, MFU = tokens * (6N + 2N per extra forward) / time / peak (N without the
input embedding; H200 dense bf16 peak ~790 TFLOP/s), peak memory, the ratio to plain, and the largest
micro-batch that fits (one forward + backward per size, up to the first out-of-memory).

Reference (plain transformers, 1.5B shape, H200): 30.1k tok/s = 47% MFU at 82 GiB with a full
log-softmax; 27.7k tok/s = 43% at 73 GiB with a simple chunked log-prob. Target: >= 50% MFU at
1.5B, never slower than plain, less peak memory than chunked.

    python -m bench.train_gpu --quick     # ~5 min on an H200: 1.5B, 128 x 1,024 tokens
    python -m bench.train_gpu             # 0.5B and 1.5B, 512 x 1,024 tokens (~10 min)
    python -m bench.train_gpu --tiny      # the whole script on CPU with a tiny model
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import random
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from trainer.logprobs import token_logprobs, token_logprobs_plain
from trainer.loss import Denominator, LossConfig, policy_loss
from trainer.packing import pack_batch
from trainer.policy import PolicyLogprobs, compile_decoder_layers
from trainer.step import StepConfig, train_step

QWEN2 = {"model_type": "qwen2", "vocab_size": 151936, "max_position_embeddings": 32768, "rope_theta": 1e6,
         "tie_word_embeddings": True, "num_key_value_heads": 2}  # fmt: skip
SHAPES: dict[str, dict[str, Any]] = {
    "0.5b": {**QWEN2, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14},
    "1.5b": {**QWEN2, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12},
    "tiny": {**QWEN2, "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "max_position_embeddings": 4096},
}  # fmt: skip
GIB = 2**30


def build_model(shape: str, device: torch.device) -> nn.Module:
    """A random-initialised Qwen2 of the given shape, fp32 parameters (bf16 autocast at run time)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    params = dict(SHAPES[shape])
    config = AutoConfig.for_model(params.pop("model_type"), **params)
    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")


def flop_params(model: nn.Module) -> int:
    """N for the 6N rule: every parameter used in a matmul -- all but the input embedding (the LM head
    counts even when tied to it)."""
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    total = sum(p.numel() for p in model.parameters())  # tied weights counted once
    return total - embed.numel() + (head.numel() if head is embed else 0)


def synthetic_batch(n_seqs: int, seq_len: int, vocab: int, group: int = 8, seed: int = 0) -> dict[str, Any]:
    """A leased batch of n_seqs trajectories of exactly seq_len tokens (prompt + response)."""
    rng = random.Random(seed)
    base = -math.log(vocab)  # a random model's log-probs are near -log V
    groups = []
    for g in range(n_seqs // group):
        prompt = rng.randint(min(64, seq_len // 4), min(256, seq_len // 2))
        ids = [rng.randrange(vocab) for _ in range(prompt)]
        rewards = [rng.random() for _ in range(group)]
        mean = sum(rewards) / group
        std = max(1e-6, (sum((r - mean) ** 2 for r in rewards) / group) ** 0.5)  # GRPO advantages
        trajs = [
            {"index": i, "token_ids": ids + [rng.randrange(vocab) for _ in range(seq_len - prompt)],
             "loss_mask": [0] * prompt + [1] * (seq_len - prompt),
             "logprobs": [0.0] * prompt + [base + rng.uniform(-0.1, 0.1) for _ in range(seq_len - prompt)],
             "advantage": (rewards[i] - mean) / std, "total_reward": rewards[i]}
            for i in range(group)
        ]  # fmt: skip
        groups.append({"id": f"g{g}", "prompt_id": f"p{g}", "policy_version": 0, "trajectories": trajs})
    return {"batch_id": "bench", "expires_at": "", "groups": groups}


def _autocast(device: torch.device) -> Any:
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def plain_step(
    model: nn.Module, opt: torch.optim.Optimizer, batch: dict[str, Any], rows: int, cfg: LossConfig
) -> int:
    """The update written plainly: full logits, full fp32 log_softmax, `rows` sequences per micro-batch.
    -> input tokens processed."""
    dev = next(model.parameters()).device
    trajs = [t for g in batch["groups"] for t in g["trajectories"]]
    ids = torch.tensor([t["token_ids"] for t in trajs], device=dev)  # (B, T)
    mask = torch.tensor([t["loss_mask"] for t in trajs], device=dev)[:, 1:].float()  # (B, T-1)
    old = torch.tensor([t["logprobs"] for t in trajs], device=dev)[:, 1:]  # (B, T-1)
    adv = torch.tensor([t["advantage"] for t in trajs], device=dev)  # (B,)
    denom = Denominator(tokens=float(mask.sum()), seqs=float((mask.sum(-1) > 0).sum()))
    for s in range(0, len(trajs), rows):
        x, y = ids[s : s + rows, :-1], ids[s : s + rows, 1:]  # (r, T-1)
        with _autocast(dev):
            with torch.no_grad():  # the old policy's log-probs (the extra forward)
                old_lp = token_logprobs_plain(model(input_ids=x, use_cache=False).logits, y)
            logp = token_logprobs_plain(model(input_ids=x, use_cache=False).logits, y)  # (r, T-1)
            loss, _ = policy_loss(logp, old_lp, adv[s : s + rows], mask[s : s + rows], cfg, None, old[s : s + rows],
                                  denom=denom)  # fmt: skip
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return ids[:, :-1].numel()


def fused_step(
    policy: nn.Module, opt: torch.optim.Optimizer, batch: dict[str, Any], budget: int, cfg: LossConfig
) -> int:
    """The trainer's update (packing included in the time). -> input tokens processed."""
    mbs = pack_batch(batch, budget, "pad")
    metrics = train_step(policy, opt, mbs, StepConfig(loss=cfg, max_grad_norm=1.0, old_from_batch=False))
    return int(metrics["input_tokens"])


def _fmt(row: dict[str, Any]) -> str:
    """A result row as JSON with floats to 4 significant digits."""
    return json.dumps({k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in row.items()})


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _reset_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _peak_gib(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else float("nan")


def measure(step: Callable[[], int], device: torch.device, warmup: int, steps: int) -> dict[str, float]:
    """Run `step` warmup + steps times -> tokens/s over the measured steps and peak memory."""
    for _ in range(warmup):
        step()
    _sync(device)
    t0, tokens = time.perf_counter(), 0
    for _ in range(steps):
        tokens += step()
    _sync(device)
    seconds = time.perf_counter() - t0
    return {
        "tokens_per_s": tokens / seconds,
        "seconds_per_step": seconds / steps,
        "peak_gib": _peak_gib(device),
    }


def run_variant(
    name: str, shape: str, batch: dict[str, Any], args: argparse.Namespace, device: torch.device
) -> dict:
    """Build a fresh model, run one variant -> its measurements."""
    _reset_memory(device)
    model = build_model(shape, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=device.type == "cuda")
    cfg = LossConfig()
    if name == "plain":
        step: Callable[[], int] = lambda: plain_step(model, opt, batch, args.plain_rows, cfg)  # noqa: E731
    else:
        compiled = name == "fused+compile"
        if compiled:
            compile_decoder_layers(model)
        policy = PolicyLogprobs(model, args.chunk_tokens, head_impl="compiled" if compiled else "inplace")
        step = lambda: fused_step(policy, opt, batch, args.budget, cfg)  # noqa: E731
    out = measure(step, device, args.warmup, args.steps)
    out["n_params"] = flop_params(model)
    return out


def largest_micro_batch(
    shape: str, args: argparse.Namespace, device: torch.device, seq_len: int
) -> dict[str, Any]:
    """One forward + backward of the fused path per micro-batch size, doubling until out of memory."""
    _reset_memory(device)
    model = build_model(shape, device)
    policy = PolicyLogprobs(model, args.chunk_tokens)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    fits: dict[int, float] = {}
    for budget in args.search:
        batch = synthetic_batch(
            max(8, budget // seq_len // 8 * 8), seq_len, SHAPES[shape]["vocab_size"], seed=1
        )
        try:
            _reset_memory(device)
            fused_step(policy, opt, batch, budget, LossConfig())
            _sync(device)
            fits[budget] = _peak_gib(device)
        except torch.OutOfMemoryError:
            break
    return {"largest_fitting_tokens": max(fits, default=0), "peak_gib_by_tokens": fits}


def head_check(shape: str, tokens: int, chunk: int, device: torch.device) -> dict[str, dict[str, float]]:
    """The LM head + log-prob alone on `tokens` random hidden states: plain vs fused (inplace, compiled).
    -> per impl: seconds per forward + backward, peak memory, max |logp - plain|, relative grad error."""
    h, v = SHAPES[shape]["hidden_size"], SHAPES[shape]["vocab_size"]
    g = torch.Generator(device=device).manual_seed(0)
    hidden0 = torch.randn(1, tokens, h, device=device, generator=g)
    weight = nn.Parameter(0.02 * torch.randn(v, h, device=device, generator=g))
    targets = torch.randint(0, v, (1, tokens), device=device, generator=g)
    impls = {
        "plain": lambda x: token_logprobs_plain(x @ weight.T, targets),
        "fused-inplace": lambda x: token_logprobs(x, weight, targets, chunk, impl="inplace")[0],
        "fused-compiled": lambda x: token_logprobs(x, weight, targets, chunk, impl="compiled")[0],
    }
    out, ref = {}, None
    for name, fn in impls.items():
        for _ in range(3):  # the last repetition is timed (compile / autotune in the first)
            weight.grad = None
            hidden = hidden0.clone().requires_grad_()
            _reset_memory(device)
            base = torch.cuda.memory_allocated(device) / GIB if device.type == "cuda" else 0.0
            t0 = time.perf_counter()
            with _autocast(device):
                logp = fn(hidden)  # (1, tokens)
            logp.sum().backward()
            _sync(device)
            seconds = time.perf_counter() - t0
        grads = torch.cat([hidden.grad.flatten().float(), weight.grad.flatten()])
        ref = ref or (logp.detach(), grads)  # plain is the reference
        diff, err = (
            float((logp.detach() - ref[0]).abs().max()),
            float((grads - ref[1]).norm() / ref[1].norm()),
        )
        out[name] = {"seconds": seconds, "extra_peak_gib": _peak_gib(device) - base, "max_abs_logp_diff": diff,
                     "rel_grad_err": err, "agrees": diff < 0.05 and err < 0.05}  # fmt: skip
        print(
            f"  head {shape} {tokens} tokens {name:15s} {_fmt(out[name])}",
            flush=True,
        )
    return out


def mfu(tok_s: float, n: int, extra_forwards: int, peak_tflops: float) -> float:
    """Model FLOPs utilisation: 6N per trained token + 2N per token for each extra forward."""
    return tok_s * (6 + 2 * extra_forwards) * n / (peak_tflops * 1e12)


def bench_shape(shape: str, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    batch = synthetic_batch(args.seqs, args.seq_len, SHAPES[shape]["vocab_size"])
    rows: dict[str, Any] = {}
    for name in args.variants:
        try:
            rows[name] = run_variant(name, shape, batch, args, device)
        except (torch.OutOfMemoryError, RuntimeError) as exc:  # report and keep going
            rows[name] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        r = rows[name]
        if "tokens_per_s" in r:
            r["mfu"] = mfu(r["tokens_per_s"], r["n_params"], 1, args.peak_tflops)
        print(
            f"  {shape} {name:14s} {_fmt(r)}",
            flush=True,
        )
    base = rows.get("plain", {}).get("tokens_per_s")
    for r in rows.values():
        if base and "tokens_per_s" in r:
            r["speedup_vs_plain"] = r["tokens_per_s"] / base
    return {
        "head": head_check(shape, args.budget, args.chunk_tokens, device),
        "variants": rows,
        "micro_batch_search": largest_micro_batch(shape, args, device, args.seq_len),
    }


def print_table(results: dict[str, Any]) -> None:
    print(f"\n{'shape':6s} {'variant':14s} {'tok/s':>10s} {'MFU':>6s} {'peak GiB':>9s} {'x plain':>8s}")
    for shape, res in results.items():
        for name, r in res["variants"].items():
            if "error" in r:
                print(f"{shape:6s} {name:14s} {r['error']}")
                continue
            print(f"{shape:6s} {name:14s} {r['tokens_per_s']:10.0f} {r['mfu']:6.1%} {r['peak_gib']:9.1f} "
                  f"{r.get('speedup_vs_plain', float('nan')):8.2f}")  # fmt: skip
        search = res["micro_batch_search"]
        print(f"{shape:6s} largest fused micro-batch that fits: {search['largest_fitting_tokens']} tokens "
              f"(peak GiB by size: {search['peak_gib_by_tokens']})")  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=None, help="comma list of 0.5b,1.5b (default both; --quick: 1.5b)")
    ap.add_argument("--variants", default="plain,fused,fused+compile")
    ap.add_argument("--seqs", type=int, default=None, help="sequences per batch (default 512; --quick 128)")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--budget", type=int, default=16384, help="fused: tokens per micro-batch")
    ap.add_argument("--plain-rows", type=int, default=8, help="plain: sequences per micro-batch")
    ap.add_argument("--chunk-tokens", type=int, default=2048, help="fused head: tokens per logits chunk")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--search", default="8192,16384,32768,65536,131072", help="micro-batch sizes to try")
    ap.add_argument("--peak-tflops", type=float, default=790.0)
    ap.add_argument("--quick", action="store_true", help="1.5B only, 128 sequences (~5 min on an H200)")
    ap.add_argument("--tiny", action="store_true", help="tiny model on CPU: checks the script end to end")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    args.variants = args.variants.split(",")
    if args.tiny:
        args.shapes, args.seqs, args.seq_len = args.shapes or "tiny", args.seqs or 16, min(args.seq_len, 128)
        args.budget, args.plain_rows, args.chunk_tokens = min(args.budget, 512), min(args.plain_rows, 4), 256
        args.search = "256,512,1024"
    args.shapes = (args.shapes or ("1.5b" if args.quick else "0.5b,1.5b")).split(",")
    args.seqs = args.seqs or (128 if args.quick else 512)
    args.search = [int(s) for s in args.search.split(",")]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    if device.type == "cpu" and not args.tiny:
        raise SystemExit("no CUDA device: run with --tiny for the CPU check")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        f"device {name}, torch {torch.__version__}, {args.seqs} x {args.seq_len} tokens per step", flush=True
    )
    warm = argparse.Namespace(
        **{**vars(args), "plain_rows": 2, "budget": 256, "chunk_tokens": 256, "steps": 1}
    )
    for variant in ("plain", "fused"):  # CUDA context, library handles, allocator: paid before any timing
        run_variant(variant, "tiny", synthetic_batch(8, 64, SHAPES["tiny"]["vocab_size"]), warm, device)
    results = {shape: bench_shape(shape, args, device) for shape in args.shapes}
    print_table(results)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {"args": {k: v for k, v in vars(args).items()}, "device": name, "results": results},
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
