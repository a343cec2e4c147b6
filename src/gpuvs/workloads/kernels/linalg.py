"""Dense linear algebra apps: lud (blocked LU decomposition without pivoting) and gaussian (Gaussian
elimination of Ax = b, then back substitution). Matrices are diagonally dominant, as Rodinia's are,
so that no pivoting is needed."""

from __future__ import annotations

import numpy as np

from gpuvs.workloads.kernels.app import App, register_app


def _dominant(size: int, rng: np.random.Generator) -> np.ndarray:
    """Random matrix dominant by rows and by columns (partial pivoting would not swap a row)."""
    return (rng.random((size, size)) + size * np.eye(size)).astype(np.float32)


@register_app
class Lud(App):
    name = "lud"
    summary = "LU decomposition in place (right-looking, 64-wide blocks: panel, triangular solves, GEMM update)"
    size_meaning = "matrix order (size x size)"
    sizes = {"full": 4096, "small": 1024, "tiny": 160}
    tolerance = (1e-3, 1e-6)
    block = 64

    def inputs(self, size, rng):
        return {"matrix": _dominant(size, rng)}

    def compute(self, torch, x, size):
        a = x["matrix"].clone()
        b = self.block
        for k in range(0, size, b):
            e = min(k + b, size)
            for j in range(k, e):  # unblocked LU of the diagonal block
                a[j + 1:e, j] /= a[j, j]
                a[j + 1:e, j + 1:e].addr_(a[j + 1:e, j], a[j, j + 1:e], alpha=-1)
            if e < size:
                diag = a[k:e, k:e]
                lower = diag.tril(-1) + torch.eye(e - k, dtype=a.dtype, device=a.device)
                a[k:e, e:] = torch.linalg.solve_triangular(lower, a[k:e, e:], upper=False, unitriangular=True)
                a[e:, k:e] = torch.linalg.solve_triangular(diag.triu(), a[e:, k:e], upper=True, left=False)
                a[e:, e:].addmm_(a[e:, k:e], a[k:e, e:], alpha=-1)
        return {"lu": a}

    def reference(self, x, size):
        from scipy.linalg import lu_factor

        lu, piv = lu_factor(x["matrix"].astype(np.float64))
        if not np.array_equal(piv, np.arange(size)):
            raise ValueError("the reference LU pivoted; the input is not diagonally dominant")
        return {"lu": lu}


@register_app
class Gaussian(App):
    name = "gaussian"
    summary = "Gaussian elimination of Ax = b (a rank-1 update per row) and back substitution"
    size_meaning = "number of unknowns (size x size matrix)"
    sizes = {"full": 2048, "small": 512, "tiny": 64}
    tolerance = (1e-3, 1e-5)

    def inputs(self, size, rng):
        a = _dominant(size, rng)
        truth = rng.uniform(-1.0, 1.0, size)
        return {"matrix": a, "rhs": (a.astype(np.float64) @ truth).astype(np.float32)}

    def compute(self, torch, x, size):
        a, b = x["matrix"].clone(), x["rhs"].clone()
        for t in range(size - 1):
            m = a[t + 1:, t] / a[t, t]
            a[t + 1:, t:].addr_(m, a[t, t:], alpha=-1)
            b[t + 1:].sub_(m * b[t])
        solution = torch.linalg.solve_triangular(a.triu(), b[:, None], upper=True)[:, 0]
        return {"x": solution}

    def reference(self, x, size):
        return {"x": np.linalg.solve(x["matrix"].astype(np.float64), x["rhs"].astype(np.float64))}
