"""GRPO trainer: loss as pure tensor functions, micro-batch packing, the training step and the
lease -> log-probs -> loss -> step -> ack -> publish worker loop.

Modules: `logprobs` (fused LM-head log-probs), `loss` (clipped surrogate, KL, aggregation),
`packing` (leased batch -> micro-batches), `policy` (model wrapper), `step` (one optimizer step),
`checkpoint` (safetensors save / resume), `worker` (the loop and `grpo-curator train`).
Nothing here is imported eagerly, so `import trainer` does not import torch.
"""
