"""The tests of gpuvs.trial."""
