"""The tests of gpuvs.kube."""
