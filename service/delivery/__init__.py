"""Batch delivery: leases (lease, ack, nack, extend, expire), Arrow / JSON batches, the ready hub and long polls."""
