"""bfs: level-synchronous breadth-first search over a random directed graph (Rodinia's graph1MW_6 is
one million nodes of average out-degree 6). The reference is SciPy's unweighted shortest paths."""

from __future__ import annotations

import numpy as np

from gpuvs.workloads.kernels.app import App, register_app


@register_app
class Bfs(App):
    name = "bfs"
    summary = "breadth-first search levels from node 0 of a random graph (average out-degree 6)"
    size_meaning = "number of nodes (about 6 x size edges)"
    sizes = {"full": 1_000_000, "small": 100_000, "tiny": 2000}
    tolerance = None

    def inputs(self, size, rng):
        degree = rng.integers(1, 12, size)  # 1..11, mean 6
        return {"src": np.repeat(np.arange(size, dtype=np.int32), degree),
                "dst": rng.integers(0, size, int(degree.sum()), dtype=np.int32)}

    def compute(self, torch, x, size):
        """Per level: every edge whose source is on the frontier marks its destination; the host reads
        one flag per level to stop (as Rodinia's bfs does)."""
        src, dst = x["src"].long(), x["dst"].long()
        cost = torch.full((size,), -1, dtype=torch.int32, device=src.device)
        cost[0] = 0
        frontier = torch.zeros(size, dtype=torch.bool, device=src.device)
        frontier[0] = True
        level = 0
        while True:
            reached = torch.zeros(size, dtype=torch.bool, device=src.device)
            reached[dst[frontier[src]]] = True
            reached &= cost < 0
            if not bool(reached.any()):
                break
            level += 1
            cost[reached] = level
            frontier = reached
        return {"cost": cost}

    def reference(self, x, size):
        from scipy.sparse import csr_matrix
        from scipy.sparse.csgraph import shortest_path

        graph = csr_matrix((np.ones(len(x["src"])), (x["src"], x["dst"])), shape=(size, size))
        dist = shortest_path(graph, method="D", directed=True, unweighted=True, indices=0)
        return {"cost": np.where(np.isinf(dist), -1, dist).astype(np.int64)}
