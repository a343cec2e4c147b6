"""gpuvs fleet: the same workload on every node of a cluster, each node compared with its peers.

execute/ runs a fleet (nodes, order, trials, pairs, per GPU, history); assess/ judges it (verdicts, peers, drift,
causes); cluster/ writes what was asked (labels, conditions, events, taints); simulate/ measures the error rates.
result.py holds what a run found; vocabulary.py the words a verdict is said in."""
