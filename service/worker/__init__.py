"""Background work: the score / curate pipeline, and the processes / threads that run it."""
