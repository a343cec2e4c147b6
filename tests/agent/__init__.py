"""The tests of gpuvs.agent."""
