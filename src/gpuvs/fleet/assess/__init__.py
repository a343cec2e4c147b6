"""What a fleet's trials say: each node and pair against its peers and its own past."""
