"""gpuvs validate: the cluster test suite of a Kubernetes GPU proof of concept, as one command.

probe.py holds the pods the checks start, suite.py the suite and its rows.
functional.py, several.py, service.py and availability.py (opt-in, --disruptive) hold the checks.
docs/kubernetes.md says what each check does."""
