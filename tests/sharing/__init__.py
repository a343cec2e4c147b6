"""The tests of gpuvs.sharing."""
