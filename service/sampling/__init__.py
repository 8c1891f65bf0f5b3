"""What producers should sample next: sampling requests, refill and curriculum."""
