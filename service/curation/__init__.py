"""Curation: the curate stage (scored groups -> per-trajectory action, reason, advantage; group ready or dropped)."""
