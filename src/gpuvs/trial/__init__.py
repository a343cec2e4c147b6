"""One trial, end to end: the plan of an experiment, the runner, the launch of a worker, the zygote, the worker.

The plan has one loader for the command line and files; the runner orders and records the trials."""
