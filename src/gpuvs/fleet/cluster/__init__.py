"""What a fleet writes to the cluster, each opt-in: labels, conditions, events, taints."""
