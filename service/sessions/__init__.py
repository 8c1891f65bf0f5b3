"""Agent sessions: an OpenAI-compatible gateway that records every call token-exact (docs/agents.md)."""
