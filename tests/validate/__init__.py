"""The tests of gpuvs.validate."""
