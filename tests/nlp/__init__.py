"""The tests of gpuvs.nlp."""
