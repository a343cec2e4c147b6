"""The tests of gpuvs.store."""
