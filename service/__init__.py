"""grpo-curator service: FastAPI app, settings, database, workers and the HTTP client."""
