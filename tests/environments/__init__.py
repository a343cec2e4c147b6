"""The tests of gpuvs.environments."""
