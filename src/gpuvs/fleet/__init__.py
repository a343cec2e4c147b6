"""gpuvs fleet: the same workload on every node of a cluster, each node compared with its peers.

nodes.py picks the nodes (and says why a node cannot take part); schedule.py orders the trials
(shuffled across nodes, never two at once on one node); verdicts.py is the only place that calls
gpuvs.stats (each node against the fleet, error control across nodes and looks); adaptive.py adds
trials where a verdict is not settled; fingerprints.py flags nodes that differ from the majority;
labels.py plans and writes node labels; kube.py talks to the Kubernetes API; run.py puts it together."""
