"""GRPO trainer (the rollout producer, samplers, tasks and demo live in the `rollout` package).

Training: `logprobs` (LM head fused with the log-prob), `loss` (clipped surrogate, KL, aggregation),
`packing` (leased batch -> micro-batches), `policy` (the model as a log-prob module), `parallel`
(DDP / FSDP), `step` (one optimizer step), `checkpoint` (safetensors save / resume), `worker`
(the lease -> log-probs -> loss -> step -> ack -> publish loop; `grpo-curator train` via `cli`).
Nothing is imported eagerly, so `import trainer` does not import torch.
"""
