"""Ingest: prompts and rollout groups in (idempotent by group id), and the read API of groups."""
