"""One trial, end to end: the plan of an experiment (one loader for command line and files), the runner that
orders and records trials, the launch of a worker, the zygote it may fork from, and the worker itself."""
