"""Export: stored trajectories as SFT / DPO / KTO / rollout datasets, streamed as JSONL or Parquet."""
