"""Sampling backends for the rollout producer: transformers ``generate`` (any machine) and vLLM
(when the ``vllm`` extra is installed and a GPU is there). Both return token ids and the sampler's
log-probs of the sampled tokens (the behaviour log-probs the trainer's importance weights need)."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Completion:
    tokens: list[int]  # generated tokens, EOS included when it was generated
    logprobs: list[float]  # (len(tokens),) log-prob of each under the sampling distribution
    finish_reason: str  # "stop" (EOS) | "length" (hit max_tokens) | "aborted" (the engine gave up on it)


class Sampler(Protocol):
    def sample(self, prompt_ids: list[int], n: int, max_tokens: int, seed: int) -> list[Completion]: ...
    def close(self) -> None: ...


def stable_seed(key: str) -> int:
    """A seed from a string that is the same in every process (Python's hash() is salted)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little")


# vLLM's CompletionOutput.finish_reason -> ours. "abort" (a request the engine aborted: preempted,
# cancelled, shut down) is not an answer; any reason we do not know is treated the same way, never
# as "stop", so an unfinished completion is never scored as if it had answered.
_VLLM_FINISH = {"stop": "stop", "length": "length", "abort": "aborted"}


def vllm_finish_reason(reason: str | None) -> str:
    """vLLM's finish reason (None while unfinished) -> stop | length | aborted."""
    return _VLLM_FINISH.get(reason or "", "aborted")


def _cut(tokens: list[int], logprobs: list[float], eos: int) -> Completion:
    if eos in tokens:
        end = tokens.index(eos) + 1
        return Completion(tokens[:end], logprobs[:end], "stop")
    return Completion(tokens, logprobs, "length")


class HFSampler:
    """``model.generate`` with pure sampling (no top-k / top-p), log-probs from the processed scores."""

    def __init__(self, model: Any, eos_token_id: int, pad_token_id: int, temperature: float = 1.0,
                 device: str = "cpu") -> None:
        self.model = model.to(device).eval()
        self.eos, self.pad, self.temperature, self.device = eos_token_id, pad_token_id, temperature, device

    @torch.no_grad()
    def sample(self, prompt_ids: list[int], n: int, max_tokens: int, seed: int, **generate_kwargs: Any) -> list[Completion]:
        torch.manual_seed(seed)
        inputs = torch.tensor([prompt_ids] * n, device=self.device)  # (n, P)
        out = self.model.generate(
            inputs, attention_mask=torch.ones_like(inputs), do_sample=True, temperature=self.temperature,
            top_k=0, top_p=1.0, max_new_tokens=max_tokens, eos_token_id=self.eos, pad_token_id=self.pad,
            output_scores=True, return_dict_in_generate=True, **generate_kwargs,
        )
        generated = out.sequences[:, inputs.shape[1] :]  # (n, T)
        scores = torch.stack(out.scores, dim=1).float()  # (n, T, V): logits after temperature
        logp = torch.log_softmax(scores, dim=-1).gather(-1, generated.unsqueeze(-1)).squeeze(-1)  # (n, T)
        return [_cut(g.tolist(), lp.tolist(), self.eos) for g, lp in zip(generated, logp, strict=True)]

    def close(self) -> None:
        """Drop the model: the producer builds a new sampler for each checkpoint."""
        self.model = None


class VLLMSampler:
    """vLLM's offline engine on a checkpoint directory (``SamplingParams(logprobs=0)`` returns the
    sampled token's log-prob). The engine is asked for *processed* log-probs (after temperature): vLLM V1
    returns the raw model distribution's by default, which is not the distribution sampled from when the
    temperature is not 1. The producer closes the engine (`close`) before loading a new checkpoint."""

    def __init__(self, model_dir: str | Path, eos_token_id: int, temperature: float = 1.0,
                 gpu_memory_utilization: float = 0.5) -> None:
        from vllm import LLM

        kwargs = {"model": str(model_dir), "gpu_memory_utilization": gpu_memory_utilization, "enforce_eager": True}
        try:
            self.llm: Any = LLM(**kwargs, logprobs_mode="processed_logprobs")
        except TypeError:  # a vLLM without logprobs_mode: its log-probs may be raw (pre-temperature)
            if temperature != 1.0:
                raise RuntimeError(
                    f"this vLLM has no logprobs_mode, so it may return raw (pre-temperature) log-probs; "
                    f"at temperature {temperature} they are not the sampled distribution's. Upgrade vLLM "
                    "(logprobs_mode='processed_logprobs') or sample at temperature 1"
                ) from None
            log.warning("this vLLM has no logprobs_mode; at temperature 1 raw and processed log-probs agree")
            self.llm = LLM(**kwargs)
        self.eos, self.temperature = eos_token_id, temperature

    def close(self) -> None:
        """Shut the engine down and release its GPU memory (idempotent)."""
        llm, self.llm = self.llm, None
        if llm is None:
            return
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if callable(getattr(core, "shutdown", None)):
            core.shutdown()
        del llm
        import gc

        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def sample(self, prompt_ids: list[int], n: int, max_tokens: int, seed: int) -> list[Completion]:
        from vllm import SamplingParams

        params = SamplingParams(n=n, temperature=self.temperature, top_p=1.0, top_k=-1, max_tokens=max_tokens,
                                logprobs=0, seed=seed, stop_token_ids=[self.eos])
        [result] = self.llm.generate([{"prompt_token_ids": prompt_ids}], params, use_tqdm=False)
        out = []
        for c in result.outputs:
            tokens = list(c.token_ids)
            logprobs = [step[tok].logprob for step, tok in zip(c.logprobs, tokens, strict=True)]
            out.append(Completion(tokens, logprobs, vllm_finish_reason(c.finish_reason)))
        return out


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()
