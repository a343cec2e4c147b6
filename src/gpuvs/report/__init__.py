"""Renderers of results: terminal (rich), markdown, HTML, JSON/CSV."""
