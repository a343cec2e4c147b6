"""How a fleet runs: which nodes, in which order, how many trials, and the run itself."""
