"""Sampling backends for the rollout producer: transformers ``generate`` (any machine) and vLLM's OpenAI
server (its own virtualenv: ``make vllm``; ``rollout.vllm_server``). Both return token ids and the sampler's
log-probs of the sampled tokens (the behaviour log-probs the trainer's importance weights need)."""

from __future__ import annotations

import hashlib
import logging
import threading
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


class SamplingEnvError(RuntimeError):
    """The sampling environment failed for this prompt (not the policy's doing): the producer logs it and skips
    the prompt, never dies of it."""


class PromptTooLong(SamplingEnvError):
    """The prompt does not fit the server's context (``max_model_len``) with at least one token to generate."""


class ServerGone(SamplingEnvError):
    """The vLLM server went away (its process exited, ``/health`` refused) while a request was in flight."""


# Neutral values of every sampling parameter that changes the distribution sampled from: sent in every vLLM
# request, and given to transformers' generate, so nothing of a model's generation_config.json (a
# repetition_penalty, a min length, suppressed tokens) enters sampling. The trainer's log-prob head knows
# temperature only; with anything else the behaviour log-probs would not be the policy's.
NEUTRAL_VLLM: dict[str, Any] = {
    "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
    "frequency_penalty": 0.0, "min_tokens": 0, "ignore_eos": False, "logit_bias": None,
    "allowed_token_ids": None, "bad_words": [], "stop": None, "truncate_prompt_tokens": None}
NEUTRAL_HF = {"top_k": 0, "top_p": 1.0, "min_p": None, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0,
              "repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
              "bad_words_ids": None, "sequence_bias": None, "min_length": 0, "min_new_tokens": None,
              "suppress_tokens": None, "begin_suppress_tokens": None, "forced_bos_token_id": None,
              "forced_eos_token_id": None, "exponential_decay_length_penalty": None, "renormalize_logits": False,
              "num_beams": 1, "num_beam_groups": 1, "penalty_alpha": None, "guidance_scale": None,
              "watermarking_config": None, "low_memory": None, "max_length": None}


def neutral_generation_config(temperature: float, max_new_tokens: int, eos: int, pad: int) -> Any:
    """A transformers GenerationConfig of pure sampling at ``temperature``, every other processor off."""
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=True, temperature=temperature, max_new_tokens=max_new_tokens,
                              eos_token_id=eos, pad_token_id=pad, output_scores=True, return_dict_in_generate=True)
    for name, value in NEUTRAL_HF.items():
        if hasattr(config, name):
            setattr(config, name, value)
    return config


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
        from transformers import GenerationConfig

        self.model = model.to(device).eval()
        self.eos, self.pad, self.temperature, self.device = eos_token_id, pad_token_id, temperature, device
        # generate() fills what a given config leaves unset from the model's own generation_config.json (a
        # repetition_penalty there would change the distribution): the model keeps none of it
        self.model.generation_config = GenerationConfig(eos_token_id=eos_token_id, pad_token_id=pad_token_id)

    @torch.no_grad()
    def sample(self, prompt_ids: list[int], n: int, max_tokens: int, seed: int, **generate_kwargs: Any) -> list[Completion]:
        torch.manual_seed(seed)
        inputs = torch.tensor([prompt_ids] * n, device=self.device)  # (n, P)
        config = neutral_generation_config(self.temperature, max_tokens, self.eos, self.pad)
        out = self.model.generate(inputs, attention_mask=torch.ones_like(inputs), generation_config=config,
                                  **generate_kwargs)
        generated = out.sequences[:, inputs.shape[1] :]  # (n, T)
        scores = torch.stack(out.scores, dim=1).float()  # (n, T, V): logits after temperature
        logp = torch.log_softmax(scores, dim=-1).gather(-1, generated.unsqueeze(-1)).squeeze(-1)  # (n, T)
        return [_cut(g.tolist(), lp.tolist(), self.eos) for g, lp in zip(generated, logp, strict=True)]

    def close(self) -> None:
        """Drop the model: the producer builds a new sampler for each checkpoint."""
        self.model = None


class VLLMSampler:
    """vLLM's OpenAI server (``rollout.vllm_server``: its own virtualenv, never imported here), asked over
    HTTP: ``POST /v1/completions`` with the prompt's token ids, ``n`` samples, ``logprobs: 0`` (the sampled
    token's log-prob) and ``return_token_ids`` (the ids as vLLM sampled them, not a re-tokenisation of the
    text). The server runs with ``--logprobs-mode processed_logprobs``: log-probs after temperature, the
    distribution sampled from (vLLM's default is the raw model's). ``finish_reason`` ``abort`` (a request the
    engine aborted) becomes ``aborted``; an answer that is not one well-formed choice per sample is refused.

    ``server``: a ``VLLMServer`` this sampler owns (started on the weights, restarted on new ones by ``load``,
    stopped by ``close``); without one it talks to ``url`` (a server someone else runs), which ``load`` asks to
    ``reload_weights`` in place only when ``in_place_reload`` says its operator verified that it serves the
    checkpoint's weights (vLLM 0.32's CPU build was measured serving wrong ones): else it refuses.

    Every request sends neutral values of all other sampling parameters (``NEUTRAL_VLLM``). A prompt that does
    not fit ``max_model_len`` is ``PromptTooLong``; a server that went away while a request was in flight (its
    process exited, ``/health`` refused or not 200) is ``ServerGone`` within a few seconds (``read_timeout_s``
    bounds a server that hangs while healthy); both are ``SamplingEnvError``: the prompt's, not the producer's."""

    def __init__(self, url: str, eos_token_id: int, temperature: float = 1.0, *, server: Any = None,
                 model: str = "policy", read_timeout_s: float = 1800.0, connect_timeout_s: float = 10.0,
                 in_place_reload: bool = False, max_model_len: int | None = None,
                 health_every_s: float = 2.0) -> None:
        import httpx

        self.url, self.server, self.model = url.rstrip("/"), server, model
        self.eos, self.temperature, self.in_place_reload = eos_token_id, temperature, in_place_reload
        self.timeout = httpx.Timeout(read_timeout_s, connect=connect_timeout_s)
        self.health_every_s = health_every_s
        self.http = httpx.Client(timeout=self.timeout)
        self._max_model_len = max_model_len if max_model_len else getattr(server, "max_model_len", None)

    @classmethod
    def start(cls, weights: str | Path, eos_token_id: int, temperature: float = 1.0, log_path: str | Path | None = None,
              ready_timeout_s: float = 900.0, max_model_len: int | None = None) -> VLLMSampler:
        """Start vLLM's server on ``weights`` (no tokenizer needed: the producer speaks token ids) and wait for
        it. ``max_model_len``: the server's context (default: the model's max_position_embeddings). A wrong
        GRPO_CURATOR_VLLM_PYTHON is a RuntimeError naming the setting before anything starts."""
        from rollout.vllm_server import VLLMServer, check_python

        check_python()
        server = VLLMServer(weights, skip_tokenizer_init=True, log_path=log_path, max_model_len=max_model_len,
                            extra_args=["--return-tokens-as-token-ids"])
        try:
            seconds = server.wait_ready(ready_timeout_s)
        except BaseException:
            server.stop()
            raise
        log.info("vLLM serving %s at %s (ready in %.0f s, max_model_len %s)", weights, server.url, seconds,
                 server.max_model_len)
        return cls(server.url, eos_token_id, temperature, server=server, model=server.served_name)

    def load(self, weights: str | Path) -> None:
        """The weights of a new checkpoint. A server this sampler started is restarted on them: vLLM 0.32's in
        place ``reload_weights`` was measured to serve neither the old nor the new weights of a tied-embedding
        Qwen2 (tests/rollout/test_vllm.py keeps that check). A server someone else runs (``url``) is asked to
        ``reload_weights`` in place only with ``in_place_reload`` (the producer's ``vllm_url_in_place_reload``:
        its operator verified that their vLLM serves the checkpoint after it); else RuntimeError: the producer
        would report the checkpoint's version for samples of other weights."""
        if self.server is None:
            if not self.in_place_reload:
                raise RuntimeError(
                    f"vLLM at {self.url} is someone else's server: reloading {weights} in place is refused, as vLLM "
                    "0.32's reload_weights was measured serving wrong weights (docs/vllm.md). Set "
                    "vllm_url_in_place_reload=true once you verified that your vLLM serves the checkpoint's "
                    "log-probs after reload_weights, or drop vllm_url to let the producer restart its own server")
            from rollout.vllm_server import reload_weights

            log.warning("vLLM at %s: reloading %s in place (vllm_url_in_place_reload: the operator verified it)",
                        self.url, weights)
            reload_weights(self.url, weights)
            return
        old, log_path, max_len = self.server, self.server.log_path, self.server.max_model_len
        old.stop()
        self.server = None
        fresh = VLLMSampler.start(weights, self.eos, self.temperature, log_path=log_path, max_model_len=max_len)
        self.url, self.server, self.model = fresh.url, fresh.server, fresh.model
        fresh.http.close()

    def close(self) -> None:
        """Stop the server this sampler started (idempotent)."""
        server, self.server = self.server, None
        if server is not None:
            server.stop()
        self.http.close()

    @property
    def max_model_len(self) -> int | None:
        """The server's context: its own (``GET /v1/models``) for a server someone else runs."""
        if self._max_model_len is None:
            try:
                r = self.http.get(self.url + "/models", timeout=30)
                cards = [c for c in r.json().get("data", []) if c.get("id") == self.model] if r.status_code == 200 else []
                self._max_model_len = int(cards[0]["max_model_len"]) if cards and cards[0].get("max_model_len") else None
            except Exception as exc:  # an httpx error, an odd answer: unknown, vLLM's own 400 then tells
                log.warning("vLLM at %s: could not read max_model_len from /v1/models: %s", self.url, exc)
        return self._max_model_len

    def budget(self, prompt_len: int, max_tokens: int) -> int:
        """The tokens a prompt of ``prompt_len`` can really generate: ``max_tokens``, less where the context
        ends sooner (vLLM would cut there silently); PromptTooLong when not even one fits."""
        limit = self.max_model_len
        if limit is None:
            return max_tokens
        if prompt_len >= limit:
            raise PromptTooLong(f"prompt of {prompt_len} tokens does not fit vLLM's max_model_len {limit} with one "
                                "token to generate (the producer's vllm_max_model_len)")
        return min(max_tokens, limit - prompt_len)

    def body(self, prompt_ids: list[int], n: int, max_tokens: int, seed: int) -> dict[str, Any]:
        return {**NEUTRAL_VLLM, "model": self.model, "prompt": list(prompt_ids), "n": n, "max_tokens": max_tokens,
                "temperature": self.temperature, "seed": seed, "logprobs": 0, "return_token_ids": True,
                "stop_token_ids": [self.eos], "skip_special_tokens": False}

    def sample(self, prompt_ids: list[int], n: int, max_tokens: int, seed: int) -> list[Completion]:
        self.budget(len(prompt_ids), max_tokens)  # a prompt that cannot fit is the prompt's failure, not a 400
        r = self._post(self.url + "/completions", self.body(prompt_ids, n, max_tokens, seed))
        # vLLM's 400s for a prompt that leaves no room: longer than the context, or exactly as long (0 tokens left)
        if r.status_code == 400 and any(m in r.text for m in ("context length", "maximum model length",
                                                               "max_tokens must be at least 1, got 0")):
            raise PromptTooLong(f"vLLM refused a prompt of {len(prompt_ids)} tokens: {r.text[:300]}")
        if r.status_code >= 500:
            raise SamplingEnvError(f"vLLM at {self.url} answered {r.status_code}: {r.text[:500]}")
        if r.status_code != 200:
            raise RuntimeError(f"vLLM answered {r.status_code}: {r.text[:500]}")
        return parse_completions(r.json(), n)

    def gone(self) -> str | None:
        """Why the server is gone (its process exited, ``/health`` refused or 5xx: vLLM's answer once its engine
        died); None while it is up. A health check that merely times out (a busy CPU) does not count."""
        import httpx

        if self.server is not None and self.server.exited():
            return f"its process exited with {self.server.proc.returncode}"
        try:
            r = httpx.get(self.url.removesuffix("/v1") + "/health", timeout=5)
        except (httpx.ConnectError, httpx.RemoteProtocolError) as exc:
            return f"/health refused ({type(exc).__name__})"
        except httpx.HTTPError:
            return None
        return f"/health answered {r.status_code}" if r.status_code >= 500 else None

    def _post(self, url: str, body: dict[str, Any]) -> Any:
        """POST in a worker thread while this one watches the server: ServerGone as soon as it went away (an
        open connection to a server that was SIGTERMed can hang until the read timeout), SamplingEnvError on a
        connection or read failure."""
        import httpx

        result: dict[str, Any] = {}

        def post() -> None:
            try:
                result["r"] = self.http.post(url, json=body)
            except BaseException as exc:  # handed to the caller
                result["e"] = exc

        worker = threading.Thread(target=post, daemon=True, name="vllm-request")
        worker.start()
        while True:
            worker.join(self.health_every_s)
            if not worker.is_alive():
                break
            why = self.gone()
            if why is not None:
                worker.join(1.0)  # the answer may have come in the meantime
                if worker.is_alive():
                    self.http.close()  # the worker's connection goes with it; later calls get a fresh client
                    self.http = httpx.Client(timeout=self.timeout)
                    raise ServerGone(f"vLLM at {self.url} went away during a request: {why}")
                break
        if "e" in result:
            exc = result["e"]
            if isinstance(exc, httpx.TransportError):
                why = self.gone()
                cls = ServerGone if why else SamplingEnvError
                raise cls(f"vLLM at {self.url}: {type(exc).__name__}: {exc}{f' ({why})' if why else ''}") from exc
            raise exc
        return result["r"]


def parse_completions(payload: Any, n: int) -> list[Completion]:
    """vLLM's ``/v1/completions`` answer -> one Completion per choice, in choice order; ValueError naming
    what is missing or inconsistent (token ids and log-probs must pair up one to one)."""
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list) or len(choices) != n or not all(isinstance(c, dict) for c in choices):
        raise ValueError(f"choices: expected {n} choices")
    out = []
    for c in sorted(choices, key=lambda c: c.get("index", 0)):
        tokens = c.get("token_ids")
        lps = (c.get("logprobs") or {}).get("token_logprobs")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise ValueError("choices[].token_ids: missing (vLLM >= 0.10.2 with return_token_ids)")
        if (not isinstance(lps, list) or len(lps) != len(tokens)
                or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in lps)):
            raise ValueError("choices[].logprobs.token_logprobs: missing or not one per token")
        out.append(Completion(list(tokens), [float(x) for x in lps], vllm_finish_reason(c.get("finish_reason"))))
    return out


def vllm_available() -> bool:
    """vLLM's virtualenv is installed (``make vllm`` / GRPO_CURATOR_VLLM_PYTHON) and a GPU is there: the
    producer's ``auto`` backend. On a CPU machine ask for ``backend: vllm`` explicitly."""
    from rollout.vllm_server import unavailable_reason

    return unavailable_reason() is None and torch.cuda.is_available()
