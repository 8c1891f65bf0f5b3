"""Adapters that let verl, OpenRLHF and TRL score with a running grpo-curator service.

Importable with nothing but ``httpx`` and ``orjson`` (no torch, no server dependencies). The service URL,
reward spec and API key come from arguments or from ``GRPO_CURATOR_URL``, ``GRPO_CURATOR_REWARD_SPEC`` and
``GRPO_CURATOR_API_KEY``. See docs/integrations.md.
"""
