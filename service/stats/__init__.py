"""Reward statistics: the pre-aggregated rollup, its sketches, ``GET /v1/stats``."""
