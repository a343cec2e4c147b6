"""The tests of gpuvs.serve."""
