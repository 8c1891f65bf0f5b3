"""The policy as a module that returns log-probs, not logits.

`PolicyLogprobs` runs a transformers causal LM's decoder and feeds its last hidden states to the
fused LM-head log-prob (`trainer.logprobs.token_logprobs`), so the full (tokens, vocab) logits never
exist. Being one nn.Module with the LM inside, it is what DDP / FSDP wrap: gradient hooks see the
head weight, and a forward through the wrapper is a forward of every parameter.

Two things make it the model's own distribution, the same in every forward:
- Logit scale. Some models scale their logits after the LM head (Granite divides by `logits_scaling`,
  Cohere multiplies by `logit_scale`, Falcon-H1 by `lm_head_multiplier`, MiniCPM3 divides the hidden
  states first). Rather than a list of attributes that goes stale, `measure_logit_scale` runs the model
  once on a few fixed tokens and fits its logits to `hidden @ W.T`: the scale s is folded into the
  temperature (logits / T = z / (T / s)). A model whose logits are not a constant multiple of
  `hidden @ W.T` (soft-capping, a bias) is refused with the config attributes that may cause it.
- Dropout. pi_old is computed without gradient and pi_theta with it; with dropout on in the gradient
  forward their ratio would not be 1 at identical weights. Every dropout (and router / input jitter,
  layerdrop) is switched off at construction (`disable_dropout`: by module type and by attribute name,
  not a fixed list), and `check_no_training_noise` verifies that a train-mode forward equals an
  eval-mode one (else the model is refused), so train and eval forwards are the same function. The
  gradient forward stays in train mode because transformers' gradient checkpointing runs only then.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import Tensor, nn

from trainer.logprobs import DEFAULT_CHUNK_TOKENS, HeadImpl, token_logprobs
from trainer.packing import MicroBatch

_NOISE_NAME = re.compile(r"drop|jitter", re.IGNORECASE)  # dropout, layerdrop, attn_pdrop, input_jitter_noise...
_CALIBRATION_TOKENS = 8


def _noise_attrs(obj: Any) -> list[str]:
    """Names of `obj`'s own float attributes that are dropout probabilities or training-time noise levels
    (by name: every name containing "drop" or "jitter"; bools and zeros excluded)."""
    return [k for k, v in vars(obj).items()
            if isinstance(v, float) and not isinstance(v, bool) and v and _NOISE_NAME.search(k)]


def _configs(config: Any, seen: set[int] | None = None) -> list[Any]:
    """`config` and every config nested in it (text_config, attn_config, ...), each once."""
    from transformers import PretrainedConfig

    seen = set() if seen is None else seen
    if not isinstance(config, PretrainedConfig) or id(config) in seen:
        return []
    seen.add(id(config))
    out = [config]
    for value in vars(config).values():
        out += _configs(value, seen)
    return out


def disable_dropout(model: nn.Module) -> int:
    """Set every dropout probability and training-time noise of `model` to 0 -> how many non-zero module
    values were switched off. Generic, not a list of attribute names that goes stale: every
    ``nn.Dropout``-family module gets p = 0, and every float attribute whose name contains "drop" or
    "jitter" (dropout, attention_dropout, residual_dropout, layerdrop, attn_dropout_p, input_jitter_noise,
    ...) is set to 0 on every submodule and on the config and each config nested in it (dicts inside a
    config too: MPT's attn_config). `check_no_training_noise` then verifies it."""
    changed = 0
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd) and module.p:
            module.p, changed = 0.0, changed + 1
        for name in _noise_attrs(module):
            setattr(module, name, 0.0)
            changed += 1
    for cfg in _configs(getattr(model, "config", None)):
        for name in _noise_attrs(cfg):
            try:
                setattr(cfg, name, 0.0)
            except Exception:  # noqa: BLE001 - a strict config field; the modules are what run (and are checked)
                continue
        for value in vars(cfg).values():
            if isinstance(value, dict):
                for key, v in list(value.items()):
                    if isinstance(v, float) and v and _NOISE_NAME.search(str(key)):
                        value[key] = 0.0
    return changed


@torch.no_grad()
def check_no_training_noise(model: Any) -> None:
    """Raise ValueError when a train-mode forward of `model` still differs from an eval-mode one on fixed
    tokens (a training-time noise source `disable_dropout` did not find); the mode is restored."""
    weight = model.get_input_embeddings().weight
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, weight.shape[0], (1, _CALIBRATION_TOKENS), generator=gen).to(weight.device)  # (1, K)
    was_training = model.training
    try:
        model.eval()
        ref = model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state.double()  # (1, K, H)
        model.train()
        got = model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state.double()  # (1, K, H)
    finally:
        model.train(was_training)
    tol = (1e-2 if weight.dtype in (torch.float16, torch.bfloat16) else 1e-5) * max(float(ref.abs().max()), 1.0)
    err = float((ref - got).abs().max())
    if not err <= tol:
        left = sorted({f"{type(m).__name__}.{k}" for m in model.modules() for k, v in vars(m).items()
                       if isinstance(v, float) and v and not isinstance(v, bool)})[:20]
        raise ValueError(
            f"the model's train-mode forward differs from its eval-mode forward by {err:.3g} after every dropout "
            f"was switched off: a training-time noise source the trainer does not know, so pi_theta / pi_old "
            f"would not be 1 at identical weights. Non-zero float module attributes: {', '.join(left) or 'none'}"
        )


def _scale_attributes(config: Any) -> list[str]:
    """Config attributes whose names suggest they change the logits (for error messages)."""
    names = []
    for cfg in (config, getattr(config, "text_config", None)):
        for key, value in (vars(cfg).items() if cfg is not None else ()):
            low = key.lower()
            if value and ("logit" in low or "multiplier" in low or "softcap" in low):
                names.append(f"{key}={value!r}")
    return names


@torch.no_grad()
def measure_logit_scale(model: Any) -> float:
    """s with model logits = s * (decoder hidden @ W.T), measured on fixed tokens (see the module docstring).

    Raises ValueError when the logits are not such a multiple (then the fused head would be wrong)."""
    weight = model.get_output_embeddings().weight  # (V, H)
    vocab = weight.shape[0]
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (1, _CALIBRATION_TOKENS), generator=gen).to(weight.device)  # (1, K)
    was_training = model.training
    model.eval()
    try:
        full = model(input_ids=ids, use_cache=False).logits.double()  # (1, K, V)
        hidden = model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state  # (1, K, H)
    finally:
        model.train(was_training)
    z = (hidden @ weight.T).double()  # (1, K, V)
    scale = float((full * z).sum() / (z * z).sum().clamp_min(1e-300))
    tol = (1e-2 if weight.dtype in (torch.float16, torch.bfloat16) else 1e-4) * max(float(full.abs().max()), 1e-6)
    err = float((full - scale * z).abs().max())
    if not (scale > 0 and err <= tol):
        attrs = ", ".join(_scale_attributes(model.config)) or "none found"
        raise ValueError(
            f"the model's logits are not a positive multiple of hidden @ lm_head.weight (max deviation {err:.3g} "
            f"after the best scale {scale:.4g}); the fused log-prob head cannot reproduce them. Config "
            f"attributes that may change the logits: {attrs}"
        )
    return 1.0 if abs(scale - 1.0) <= tol / max(float(full.abs().max()), 1e-6) else scale  # rounding, not a scale


class PolicyLogprobs(nn.Module):
    """Causal LM -> per-token log-probs and entropies of given targets.

    forward: input_ids, position_ids (R, L), attention_mask (R, L) | None, targets (R, L),
    temperature (R, L) | None (None: the policy's one temperature) -> (logp (R, L) fp32, entropy (R, L) fp32).
    """

    def __init__(
        self,
        model: Any,
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
        temperature: float = 1.0,
        head_impl: HeadImpl = "inplace",
    ):
        super().__init__()
        head = model.get_output_embeddings()
        if head is None or getattr(head, "bias", None) is not None:
            raise ValueError("the LM head must be a linear layer without bias")
        for cfg in (model.config, getattr(model.config, "text_config", None)):
            softcapping = getattr(cfg, "final_logit_softcapping", None)
            if softcapping:
                raise ValueError(
                    "models with final logit soft-capping (config final_logit_softcapping="
                    f"{softcapping!r}) are not supported by the fused head"
                )
        disable_dropout(model)
        check_no_training_noise(model)
        self.model: Any = model  # a transformers PreTrainedModel
        self.chunk_tokens = chunk_tokens
        self.temperature = temperature
        self.head_impl = head_impl
        self.logit_scale = measure_logit_scale(model)  # logits = logit_scale * hidden @ W.T

    def forward(
        self,
        input_ids: Tensor,
        position_ids: Tensor,
        attention_mask: Tensor | None,
        targets: Tensor,
        temperature: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        out = self.model.get_decoder()(
            input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask, use_cache=False
        )
        hidden = out.last_hidden_state  # (R, L, H)
        weight = self.model.get_output_embeddings().weight  # (V, H)
        temp = self.temperature if temperature is None else temperature
        if self.logit_scale != 1.0:
            temp = temp / self.logit_scale  # logits / T = (hidden @ W.T) / (T / s)
        return token_logprobs(hidden, weight, targets, self.chunk_tokens, temp, self.head_impl)


def sequence_logprobs(policy: nn.Module, mb: MicroBatch) -> tuple[Tensor, Tensor]:
    """Run `policy` (a PolicyLogprobs, possibly wrapped) on a micro-batch and gather the per-sequence
    layout: -> (logp (S, Tm), entropy (S, Tm)); positions past a sequence's end are meaningless
    (their loss mask is 0)."""
    logp, ent = policy(mb.input_ids, mb.position_ids, mb.attention_mask, mb.targets, mb.temperature)  # (R, L) x2
    return logp.reshape(-1)[mb.gather_index], ent.reshape(-1)[mb.gather_index]


@torch.no_grad()
def frozen_logprobs(policy: nn.Module, mb: MicroBatch) -> Tensor:
    """Log-probs (S, Tm) without gradient: the old policy or the frozen reference, in eval mode (no
    dropout: pi_old is the policy's distribution, not one dropout sample of it); the mode is restored."""
    was_training = policy.training
    policy.eval()
    try:
        return sequence_logprobs(policy, mb)[0]
    finally:
        policy.train(was_training)


def decoder_layers(module: nn.Module) -> list[nn.Module]:
    """The transformer blocks inside `module`: instances of the classes any submodule lists in
    transformers' `_no_split_modules` (the FSDP wrapping unit and the compile unit)."""
    names: set[str] = set()
    for sub in module.modules():
        names |= set(getattr(sub, "_no_split_modules", None) or [])
    return [m for m in module.modules() if type(m).__name__ in names]


def compile_decoder_layers(model: nn.Module) -> int:
    """torch.compile each transformer block in place (fuses norms, rotary, activations) -> how many."""
    layers = decoder_layers(model)
    for layer in layers:
        layer.compile()
    return len(layers)
