"""gpuvs agent: gpuvs inside the cluster, one replica (deploy/, docs/deploy.md).

On a schedule and on demand, it runs validate and a fleet per workload on the nodes nobody else has requested.
It writes the node labels, keeps every result in its store, and serves /metrics and the status page.
service.py is the agent and runs.py one run; docs/internals.md says what each other module owns."""
