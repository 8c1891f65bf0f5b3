"""Shared HTTP plumbing: dependencies, the one error type and its handler, the request guard (wire checks), OpenAPI and its examples."""
