"""Rollout throughput benchmark (not a test): the producer's two samplers on the same tiny model, side by side.

Saves the tiny random Qwen2 of ``rollout.vllm_server`` (hidden 128, 2 heads, the smallest vLLM's CPU build
serves) once, then samples the same groups with both of the producer's samplers in this one run:
``HFSampler`` (transformers ``generate``) and ``VLLMSampler`` (vLLM's OpenAI server, started the way the
producer starts it: its own virtualenv, ``make vllm``). Each does one warm-up group, then ``--groups``
groups of ``--n`` samples of up to ``--max-tokens`` tokens (EOS ends a sample early, as in production).
Prints generated tokens/s of each and the ratio, and vLLM's server start time.

    python -m bench.rollout                      # 8 groups x 8 samples x 64 tokens (~3 min here, most of it vLLM's start)
    python -m bench.rollout --groups 32 --n 16 --max-tokens 256
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from rollout.sampler import HFSampler, Sampler, VLLMSampler
from rollout.vllm_server import char_tokenizer, save_tiny_model, unavailable_reason

EOS, PAD = 2, 0


def measure(sampler: Sampler, prompts: list[list[int]], n: int, max_tokens: int) -> dict[str, Any]:
    sampler.sample(prompts[0], n, max_tokens, seed=0)  # warm-up (first-call compilation, caches)
    start, tokens = time.monotonic(), 0
    for i, prompt in enumerate(prompts):
        tokens += sum(len(c.tokens) for c in sampler.sample(prompt, n, max_tokens, seed=1 + i))
    seconds = time.monotonic() - start
    return {"tokens": tokens, "seconds": round(seconds, 2), "tokens_per_s": round(tokens / seconds, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.rollout", description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--n", type=int, default=8, help="samples per group (one request)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0)
    args = ap.parse_args(argv)
    reason = unavailable_reason()
    if reason is not None:
        raise SystemExit(f"bench.rollout needs vLLM: {reason}")
    tok = char_tokenizer()
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"{i}+{i + 1}="}], add_generation_prompt=True,
                                       tokenize=True)["input_ids"] for i in range(args.groups)]
    with tempfile.TemporaryDirectory(prefix="bench-rollout-") as tmp:
        model_dir = save_tiny_model(Path(tmp) / "model")
        from transformers import AutoModelForCausalLM

        hf = HFSampler(AutoModelForCausalLM.from_pretrained(str(model_dir)), EOS, PAD, args.temperature)
        results = {"transformers": measure(hf, prompts, args.n, args.max_tokens)}
        hf.close()
        start = time.monotonic()
        vllm = VLLMSampler.start(model_dir, EOS, args.temperature, log_path=Path(tmp) / "vllm.log")
        start_s = time.monotonic() - start
        try:
            results["vllm"] = measure(vllm, prompts, args.n, args.max_tokens)
        finally:
            vllm.close()
    ratio = results["vllm"]["tokens_per_s"] / results["transformers"]["tokens_per_s"]
    print(f"{'sampler':<14} {'tokens':>7} {'seconds':>8} {'tokens/s':>9}")
    for name, r in results.items():
        print(f"{name:<14} {r['tokens']:>7} {r['seconds']:>8} {r['tokens_per_s']:>9}")
    print(f"vLLM / transformers tokens/s: {ratio:.2f}x   vLLM server start: {start_s:.0f} s")
    print(json.dumps({"config": vars(args), "results": results, "ratio": round(ratio, 2),
                      "vllm_start_s": round(start_s, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
