"""Policy versions: the trainer publishes each version; producers, curation and delivery read the current one."""
