"""gpuvs fleet: the same workload on every node of a cluster, each node compared with its peers.

nodes.py picks the nodes (and says why a node cannot take part); schedule.py orders the trials
(shuffled across nodes, never two at once on one node); verdicts.py calls gpuvs.analysis.stats for
each node against the fleet (error control across nodes and looks); adaptive.py adds
trials where a verdict is not settled; fingerprints.py flags nodes that differ from the majority;
labels.py plans and writes node labels; kube.py talks to the Kubernetes API; run.py puts it together;
result.py holds what it found (FleetResult, a NodeRow per node), which the reports render and the store
keeps.

Each node against its own past (docs/history.md): history.py makes each stored run's nodes into typed
points (the node's level with its se, and its speed against its fleet band as that run said) and
gathers them per node; peers.py holds each node against its peers run by run and decides who moved (a
closed test, so that one node's change is blamed on it alone); drift.py judges a node's latest run
against its earlier ones (it also calls gpuvs.analysis.stats, for its p-values); changepoint.py finds where in
its history a node changed; drift_simulate.py measures both on simulated histories; stored.py reads a
store's fleet runs into each node's history per workload with its drift verdict and change points, slow
and drifting nodes first (what `gpuvs fleet history`, the status page and the agent show)."""
