"""gpuvs validate: the cluster test suite of a Kubernetes GPU proof of concept, as one command.

- probe.py: the pods the checks start (a shell probe that reports what it sees of the GPU, then beats),
  and the waits, log reads, exec and deletes on them, each bounded by a deadline;
- suite.py: a check's result row, the suite that runs checks one by one with a timeout each, stores every
  row as soon as it is known, and deletes everything it started whatever happens;
- functional.py: GPU nodes, a GPU pod's life (scheduled, running, logs, exec, deleted), the GPU as seen
  inside, an over-request left Pending with the scheduler's reason, a CPU-only pod without a GPU;
- several.py: several one-GPU pods at once on a node, a pod asking every GPU, and what the pods share (the
  `shared` finding: more GPUs advertised than the node has);
- service.py: a CPU service pod beside a GPU job (gpuvs's worker) on one node, the job's rate before and during;
- availability.py (opt-in, --disruptive): a running GPU job and the node's GPUs through a device-plugin
  restart, a kubelet restart and an API-server outage, caused by commands the user gives.
"""
