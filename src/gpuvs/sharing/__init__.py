"""Sharing one GPU: `gpuvs share`, `advise-mps` and `share-matrix`, everything about them in this package.

run.py holds the three commands as library calls; docs/sharing.md says what each other module owns.
The command line only parses, builds a request, calls run.py and renders (report/sharing.py).
The start/stop barrier the workers meet at is gpuvs.workloads.barrier; nothing is imported here."""
