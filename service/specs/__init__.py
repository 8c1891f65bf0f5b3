"""Reward specs, curation policies (both versioned, append-only) and dataset attachments."""
