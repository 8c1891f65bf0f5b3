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
  forward their ratio would not be 1 at identical weights. Every dropout (and router jitter) is
  switched off at construction (`disable_dropout`), so train and eval forwards are the same function.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from trainer.logprobs import DEFAULT_CHUNK_TOKENS, HeadImpl, token_logprobs
from trainer.packing import MicroBatch

# module attributes holding a dropout probability or a training-time noise level (set to 0)
_NOISE_ATTRS = (
    "attention_dropout", "attn_dropout", "dropout", "dropout_p", "dropout_rate", "hidden_dropout",
    "activation_dropout", "resid_dropout", "embd_pdrop", "attn_pdrop", "resid_pdrop",
    "router_jitter_noise", "jitter_noise",
)
_CALIBRATION_TOKENS = 8


def disable_dropout(model: nn.Module) -> int:
    """Set every dropout probability and router jitter of `model` (modules and config) to 0 -> how many
    non-zero values were switched off."""
    changed = 0
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd) and module.p:
            module.p, changed = 0.0, changed + 1
        for name in _NOISE_ATTRS:
            value = getattr(module, name, None)
            if isinstance(value, float) and not isinstance(value, bool) and value:
                setattr(module, name, 0.0)
                changed += 1
    config = getattr(model, "config", None)
    for cfg in (config, getattr(config, "text_config", None)):
        for name in _NOISE_ATTRS:
            if cfg is not None and isinstance(getattr(cfg, name, None), float) and getattr(cfg, name):
                setattr(cfg, name, 0.0)
    return changed


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
            if getattr(cfg, "final_logit_softcapping", None):
                raise ValueError(
                    "models with final logit soft-capping (config final_logit_softcapping="
                    f"{cfg.final_logit_softcapping!r}) are not supported by the fused head"
                )
        disable_dropout(model)
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
