"""`python -m gpuvs`: the entry point, which starts the command line."""

from gpuvs.cli import main

main()
