"""The tests of gpuvs.cli."""
