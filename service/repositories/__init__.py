"""All SQL statements live here, one module per domain. Repositories may flush, never commit."""
