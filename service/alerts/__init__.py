"""Training-health alerts: monitors over stored groups and trainer metrics, durable alert state, a lease breaker."""
