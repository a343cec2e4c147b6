"""The tests of gpuvs.report."""
