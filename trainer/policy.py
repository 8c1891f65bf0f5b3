"""The policy as a module that returns log-probs, not logits.

`PolicyLogprobs` runs a transformers causal LM's decoder and feeds its last hidden states to the
fused LM-head log-prob (`trainer.logprobs.token_logprobs`), so the full (tokens, vocab) logits never
exist. Being one nn.Module with the LM inside, it is what DDP / FSDP wrap: gradient hooks see the
head weight, and a forward through the wrapper is a forward of every parameter.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from trainer.logprobs import DEFAULT_CHUNK_TOKENS, HeadImpl, token_logprobs
from trainer.packing import MicroBatch


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
        if getattr(model.config, "final_logit_softcapping", None):
            raise ValueError("models with final logit soft-capping are not supported by the fused head")
        self.model: Any = model  # a transformers PreTrainedModel
        self.chunk_tokens = chunk_tokens
        self.temperature = temperature
        self.head_impl = head_impl

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
