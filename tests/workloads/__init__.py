"""The tests of gpuvs.workloads."""
