"""gpuvs: how GPU jobs really perform, compared with numbers you can trust."""

__version__ = "0.1.0"
