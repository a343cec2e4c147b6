"""Dynamic programming apps: pathfinder (cheapest path down a grid) and nw (Needleman-Wunsch global
sequence alignment). Integer results, so the check is exact."""

from __future__ import annotations

import numpy as np

from gpuvs.workloads.kernels.app import App, register_app


@register_app
class Pathfinder(App):
    name = "pathfinder"
    summary = "cheapest path from the top to the bottom row of a grid of weights (row-by-row DP), 100 rows"
    size_meaning = "columns (grid of 100 rows x size columns)"
    sizes = {"full": 1_000_000, "small": 100_000, "tiny": 500}
    tolerance = None
    rows = 100

    def inputs(self, size, rng):
        return {"wall": rng.integers(0, 10, (self.rows, size), dtype=np.int32)}

    def compute(self, torch, x, size):
        wall = x["wall"]
        src = wall[0]
        for i in range(1, self.rows):
            left = torch.cat((src[:1], src[:-1]))
            right = torch.cat((src[1:], src[-1:]))
            src = wall[i] + torch.minimum(torch.minimum(left, src), right)
        return {"cost": src}

    def reference(self, x, size):
        wall = x["wall"].astype(np.int64)
        src = wall[0]
        for i in range(1, self.rows):
            padded = np.concatenate(([src[0]], src, [src[-1]]))
            src = wall[i] + np.minimum(np.minimum(padded[:-2], padded[1:-1]), padded[2:])
        return {"cost": src}


@register_app
class NeedlemanWunsch(App):
    name = "nw"
    summary = "Needleman-Wunsch alignment score matrix of two random protein sequences (gap penalty 10)"
    size_meaning = "sequence length (score matrix of (size+1)^2)"
    sizes = {"full": 4096, "small": 1024, "tiny": 48}
    tolerance = None
    penalty = 10
    alphabet = 24

    def inputs(self, size, rng):
        sub = rng.integers(-4, 12, (self.alphabet, self.alphabet), dtype=np.int32)
        return {"seq1": rng.integers(0, self.alphabet, size, dtype=np.int32),
                "seq2": rng.integers(0, self.alphabet, size, dtype=np.int32),
                "substitution": np.triu(sub) + np.triu(sub, 1).T}  # symmetric, like BLOSUM62

    def compute(self, torch, x, size):
        """Row by row: F[i][j] = max(t[j], F[i][j-1] - p) unrolls to a running maximum,
        F[i][j] = max_k(u[k] + p k) - p j, so each row is a few vector operations and one cummax."""
        p = self.penalty
        sim = x["substitution"][x["seq1"].long()[:, None], x["seq2"].long()[None, :]]
        steps = torch.arange(size + 1, dtype=torch.int32, device=sim.device) * p
        score = torch.empty((size + 1, size + 1), dtype=torch.int32, device=sim.device)
        score[0] = -steps
        score[:, 0] = -steps
        prev = score[0]
        for i in range(1, size + 1):
            u = torch.cat((score[i, :1], torch.maximum(prev[:-1] + sim[i - 1], prev[1:] - p)))
            row = torch.cummax(u + steps, 0).values - steps
            score[i] = row
            prev = row
        return {"score": score}

    def reference(self, x, size):
        """Anti-diagonal by anti-diagonal (a different order from the device code)."""
        p = self.penalty
        sim = x["substitution"][x["seq1"][:, None], x["seq2"][None, :]].astype(np.int64)
        f = np.zeros((size + 1, size + 1), dtype=np.int64)
        f[0, :] = -p * np.arange(size + 1)
        f[:, 0] = -p * np.arange(size + 1)
        for d in range(2, 2 * size + 1):
            i = np.arange(max(1, d - size), min(size, d - 1) + 1)
            j = d - i
            f[i, j] = np.maximum(np.maximum(f[i - 1, j - 1] + sim[i - 1, j - 1], f[i, j - 1] - p), f[i - 1, j] - p)
        return {"score": f}
