"""The tests of gpuvs.fleet."""
