"""The fused log-prob head is the model's own distribution: logit scales applied, dropout off.

Models that scale their logits after the LM head (Granite, Cohere, Falcon-H1, MiniCPM3) must give the
log-probs of HF's own logits; dropout must not make pi_theta differ from pi_old at identical weights.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from tests.trainer.batches import make_batch, tiny_model
from trainer.packing import pack_batch
from trainer.policy import PolicyLogprobs, disable_dropout
from trainer.step import StepConfig, train_step

V = 61
COMMON = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
# (model_type, the config fields that scale its logits, with values far from 1 so a missed scale shows)
SCALED = [
    ("granite", {"logits_scaling": 8.0}),
    ("cohere", {"logit_scale": 0.0625, "use_qk_norm": False}),
    ("falcon_h1", {"lm_head_multiplier": 3.5, "mamba_d_ssm": 32, "mamba_n_heads": 4, "mamba_d_head": 8,
                   "mamba_d_state": 8, "mamba_chunk_size": 8, "head_dim": 8}),
    ("minicpm3", {"scale_width": 4.0, "dim_model_base": 8, "q_lora_rank": 16, "kv_lora_rank": 8,
                  "qk_nope_head_dim": 4, "qk_rope_head_dim": 4, "v_head_dim": 8, "head_dim": 8,
                  "num_key_value_heads": 4}),
]


def _model(model_type: str, **fields):
    config = AutoConfig.for_model(model_type, **{**COMMON, **fields})
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager").eval()


@pytest.mark.parametrize(("model_type", "fields"), SCALED, ids=[m for m, _ in SCALED])
def test_fused_head_equals_hf_log_softmax_for_models_that_scale_their_logits(model_type, fields):
    model = _model(model_type, **fields)
    ids = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(1))  # (2, 9)
    inputs, targets = ids[:, :-1], ids[:, 1:]  # (2, 8) x2
    with torch.no_grad():
        hf = torch.log_softmax(model(input_ids=inputs).logits.double(), -1)  # (2, 8, V)
        ref = hf.gather(-1, targets[..., None])[..., 0]  # (2, 8)
        z = model.get_decoder()(input_ids=inputs).last_hidden_state @ model.get_output_embeddings().weight.T
        unscaled = torch.log_softmax(z.double(), -1).gather(-1, targets[..., None])[..., 0]
    # control: this model really scales (a head that ignored it would be this far off)
    assert float((unscaled - ref).abs().max()) > 1e-2
    policy = PolicyLogprobs(model, chunk_tokens=5)
    pos = torch.arange(8).expand(2, 8)
    with torch.no_grad():
        logp, _ = policy(inputs, pos, None, targets)  # (2, 8)
    torch.testing.assert_close(logp.double(), ref, atol=2e-5, rtol=1e-5)
    # and at a sampling temperature: logits / T of the scaled logits
    with torch.no_grad():
        logp_t, _ = policy(inputs, pos, None, targets, torch.full((2, 8), 0.7))
    ref_t = torch.log_softmax(model(input_ids=inputs).logits.double() / 0.7, -1).gather(-1, targets[..., None])
    torch.testing.assert_close(logp_t.double(), ref_t[..., 0], atol=2e-5, rtol=1e-5)


def test_soft_capped_models_are_refused_naming_the_attribute():
    model = _model("gemma2", head_dim=8, final_logit_softcapping=30.0)
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        PolicyLogprobs(model)


def test_dropout_off_so_the_first_ratio_is_exactly_one_at_identical_weights():
    model = build_dropout_model(0.3)
    batch = make_batch(n_groups=3, group_size=4, seed=5)
    metrics = train_step(PolicyLogprobs(model, 6), torch.optim.SGD(model.parameters(), lr=0.0),
                         pack_batch(batch, 10_000), StepConfig())
    assert metrics["ratio_max"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["clip_frac_low"] == metrics["clip_frac_high"] == 0.0


def test_with_dropout_left_on_the_ratio_would_not_be_one():
    """Control for the test above: the same model with its dropout switched back on after the policy was
    built moves the ratio at identical weights (so the test above can fail)."""
    model = build_dropout_model(0.3)
    policy = PolicyLogprobs(model, 6)
    for module in model.modules():
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = 0.3
    metrics = train_step(policy, torch.optim.SGD(model.parameters(), lr=0.0),
                         pack_batch(make_batch(n_groups=3, group_size=4, seed=5), 10_000), StepConfig())
    assert abs(metrics["ratio_max"] - 1.0) > 1e-3


def test_disable_dropout_zeroes_modules_and_config():
    model = build_dropout_model(0.25)
    model.add_module("extra", torch.nn.Dropout(0.5))
    assert disable_dropout(model) >= 3  # the extra module and each layer's attention dropout
    assert all(m.p == 0 for m in model.modules() if isinstance(m, torch.nn.Dropout))
    assert all(getattr(m, "attention_dropout", 0.0) == 0.0 for m in model.modules())
    assert model.config.attention_dropout == 0.0


def build_dropout_model(p: float):
    """The seed-0 tiny Qwen2 of the trainer tests with attention dropout p."""
    model = tiny_model()
    for module in model.modules():
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = p
    model.config.attention_dropout = p
    return model
