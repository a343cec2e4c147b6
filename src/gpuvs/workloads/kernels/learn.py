"""Learning apps: kmeans (Lloyd's algorithm) and backprop (training steps of a two-layer perceptron).

backprop is Rodinia's: many inputs, 16 hidden units, one output, learning rate and momentum 0.3."""

from __future__ import annotations

import numpy as np

from gpuvs.workloads.kernels.app import App, CheckResult, close, register_app


@register_app
class Kmeans(App):
    name = "kmeans"
    summary = "k-means clustering (k = 5, 34 features as in Rodinia's kdd_cup input), 20 Lloyd iterations"
    size_meaning = "number of points (494020 is kdd_cup's)"
    sizes = {"full": 494_020, "small": 100_000, "tiny": 2000}
    k, features, iterations = 5, 34, 20

    def inputs(self, size, rng):
        centers = rng.uniform(0.0, 10.0, (self.k, self.features))
        labels = rng.integers(0, self.k, size)
        labels[: self.k] = np.arange(self.k)[: size]  # the first k points (the start) lie in distinct clusters
        points = centers[labels] + rng.normal(0.0, 0.5, (size, self.features))
        return {"points": points.astype(np.float32)}

    def compute(self, torch, x, size):
        pts = x["points"]
        centroids = pts[: self.k].clone()  # Rodinia starts from the first k points
        sq = (pts * pts).sum(1, keepdim=True)
        labels = None
        for _ in range(self.iterations):
            dist = sq - 2.0 * pts @ centroids.T + (centroids * centroids).sum(1)[None, :]
            labels = dist.argmin(1)
            sums = torch.zeros_like(centroids).index_add_(0, labels, pts)
            counts = torch.bincount(labels, minlength=self.k).to(pts.dtype)
            centroids = torch.where(counts[:, None] > 0, sums / counts.clamp(min=1.0)[:, None], centroids)
        return {"centroids": centroids, "labels": labels}

    def reference(self, x, size):
        pts = x["points"].astype(np.float64)
        centroids = pts[: self.k].copy()
        sq = (pts * pts).sum(1, keepdims=True)
        labels = np.zeros(size, dtype=np.int64)
        for _ in range(self.iterations):
            dist = sq - 2.0 * pts @ centroids.T + (centroids * centroids).sum(1)[None, :]
            labels = dist.argmin(1)
            counts = np.bincount(labels, minlength=self.k)
            sums = np.stack([pts[labels == c].sum(0) for c in range(self.k)])
            centroids = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1)[:, None], centroids)
        return {"centroids": centroids, "labels": labels}

    def compare(self, out, ref) -> CheckResult:
        """Centroids within tolerance, and at most 1 point in 10^4 assigned differently (a point that is
        all but equidistant from two centroids may go either way in float32)."""
        result = close({"centroids": out.get("centroids")}, {"centroids": ref["centroids"]}, rtol=1e-3, atol=1e-3)
        labels = out.get("labels")
        if labels is None or np.shape(labels) != np.shape(ref["labels"]):
            return CheckResult(False, float("inf"), "labels missing or of the wrong shape")
        differ = float(np.mean(np.asarray(labels) != ref["labels"]))
        if differ > 1e-4:
            return CheckResult(False, differ, f"labels: {differ:.3%} of the points are assigned differently")
        return CheckResult(result.ok, result.error, result.detail + f"; labels differ for {differ:.4%}")


@register_app
class Backprop(App):
    name = "backprop"
    summary = "10 training steps of a size-16-1 perceptron (forward, errors, momentum weight updates)"
    size_meaning = "input units (weights: (size+1) x 17)"
    sizes = {"full": 1_048_576, "small": 65_536, "tiny": 4096}
    tolerance = (1e-3, 1e-5)
    hidden, steps, eta, momentum = 16, 10, 0.3, 0.3

    def inputs(self, size, rng):
        inp = rng.random(size + 1)
        inp[0] = 1.0  # bias unit
        scale = np.sqrt(3.0 / size)  # keeps the hidden layer out of saturation
        return {"input": inp.astype(np.float32),
                "w1": rng.uniform(-scale, scale, (size + 1, self.hidden + 1)).astype(np.float32),
                "w2": rng.uniform(-0.5, 0.5, (self.hidden + 1, 2)).astype(np.float32),
                "target": rng.random(1).astype(np.float32)}

    def _train(self, x, w1, w2, exp, cat, outer):
        """Rodinia's bpnn_train: layer forward twice, output and hidden errors, weight adjustments.
        exp, cat, outer: the array library's functions (torch or NumPy)."""
        def squash(v):
            return 1.0 / (1.0 + exp(-v))

        inp, target = x["input"], x["target"]
        dw1, dw2 = w1 * 0.0, w2 * 0.0
        for _ in range(self.steps):
            hidden = squash(inp @ w1[:, 1:])
            hid1 = cat((inp[:1], hidden))  # inp[0] is the bias unit, 1
            out = squash(hid1 @ w2[:, 1:])
            d_out = out * (1.0 - out) * (target - out)
            d_hid = hidden * (1.0 - hidden) * (w2[1:, 1:] @ d_out)
            dw2[:, 1:] = self.eta * outer(hid1, d_out) + self.momentum * dw2[:, 1:]
            w2[:, 1:] += dw2[:, 1:]
            dw1[:, 1:] = self.eta * outer(inp, d_hid) + self.momentum * dw1[:, 1:]
            w1[:, 1:] += dw1[:, 1:]
        return {"w1": w1, "w2": w2}

    def compute(self, torch, x, size):
        return self._train(x, x["w1"].clone(), x["w2"].clone(), torch.exp, torch.cat, torch.outer)

    def reference(self, x, size):
        x64 = {k: v.astype(np.float64) for k, v in x.items()}
        return self._train(x64, x64["w1"].copy(), x64["w2"].copy(), np.exp, np.concatenate, np.outer)
