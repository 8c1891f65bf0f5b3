"""Shared storage plumbing: engine and sessions, ORM models, array encoding, the embedded PostgreSQL, migrations, scratch databases."""
