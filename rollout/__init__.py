"""Rollout producer side: everything that makes trajectories (the trainer package only trains).

`producer` (``grpo-curator rollout``: checkpoint -> sampling requests -> groups -> POST), `sampler`
(transformers ``generate`` and vLLM backends), `episodes` (single- and multi-turn trajectories), `tasks`
(tokenizers, the letter-sum task, the tool registry), `demo` (``grpo-curator demo``). Nothing is imported
eagerly, so `import rollout` does not import torch.
"""
