"""Scoring: the worker's score stage, synchronous ``POST /v1/score``, OpenRLHF's remote reward route, rescore / recurate."""
