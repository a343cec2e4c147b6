"""The tests of gpuvs.analysis."""
