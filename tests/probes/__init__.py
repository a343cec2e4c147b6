"""The tests of gpuvs.probes."""
