"""The tests of the project as a whole."""
