"""The fleet's statistics on simulated fleets: the error rates the docs state."""
