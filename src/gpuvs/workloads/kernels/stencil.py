"""Structured-grid apps: hotspot (2D thermal simulation), hotspot3D (3D) and srad (speckle-reducing
anisotropic diffusion, v2). Formulas and constants follow Rodinia's; edges are clamped (a cell
beyond the edge is the edge cell itself)."""

from __future__ import annotations

import numpy as np

from gpuvs.workloads.kernels.app import App, Arrays, register_app

# Rodinia hotspot constants
MAX_PD, PRECISION, SPEC_HEAT_SI, K_SI, FACTOR_CHIP = 3.0e6, 0.001, 1.75e6, 100.0, 0.5
T_CHIP, CHIP_HEIGHT, CHIP_WIDTH, AMB_TEMP = 0.0005, 0.016, 0.016, 80.0
STEP = PRECISION / (MAX_PD / (FACTOR_CHIP * T_CHIP * SPEC_HEAT_SI))


def _thermal_inputs(shape: tuple[int, ...], rng: np.random.Generator) -> Arrays:
    return {"temp": (323.0 + 20.0 * rng.random(shape)).astype(np.float32),
            "power": (1e-3 * rng.random(shape)).astype(np.float32)}


@register_app
class Hotspot(App):
    name = "hotspot"
    summary = "2D transient thermal simulation of a chip (5-point stencil), 100 iterations"
    size_meaning = "grid side (size x size cells)"
    sizes = {"full": 1024, "small": 256, "tiny": 32}
    tolerance = (1e-5, 1e-2)
    check_size = 512
    iterations = 100

    def coefficients(self, size: int) -> tuple[float, float, float, float]:
        gh, gw = CHIP_HEIGHT / size, CHIP_WIDTH / size
        cap = FACTOR_CHIP * SPEC_HEAT_SI * T_CHIP * gw * gh
        rx = gw / (2.0 * K_SI * T_CHIP * gh)
        ry = gh / (2.0 * K_SI * T_CHIP * gw)
        rz = T_CHIP / (K_SI * gh * gw)
        return STEP / cap, 1.0 / rx, 1.0 / ry, 1.0 / rz

    def inputs(self, size, rng):
        return _thermal_inputs((size, size), rng)

    def compute(self, torch, x, size):
        import torch.nn.functional as F

        k, irx, iry, irz = self.coefficients(size)
        t, p = x["temp"], x["power"]
        for _ in range(self.iterations):
            g = F.pad(t[None, None], (1, 1, 1, 1), mode="replicate")[0, 0]
            north, south, west, east = g[:-2, 1:-1], g[2:, 1:-1], g[1:-1, :-2], g[1:-1, 2:]
            t = t + k * (p + (north + south - 2.0 * t) * iry + (east + west - 2.0 * t) * irx + (AMB_TEMP - t) * irz)
        return {"temp": t}

    def reference(self, x, size):
        k, irx, iry, irz = self.coefficients(size)
        t, p = x["temp"].astype(np.float64), x["power"].astype(np.float64)
        for _ in range(self.iterations):
            g = np.pad(t, 1, mode="edge")
            north, south, west, east = g[:-2, 1:-1], g[2:, 1:-1], g[1:-1, :-2], g[1:-1, 2:]
            t = t + k * (p + (north + south - 2.0 * t) * iry + (east + west - 2.0 * t) * irx + (AMB_TEMP - t) * irz)
        return {"temp": t}


@register_app
class Hotspot3D(App):
    name = "hotspot3D"
    summary = "3D thermal simulation (7-point stencil) on size x size x 32 layers, 100 iterations"
    size_meaning = "grid side (size x size x 32 cells); 512: 3 x 32 MiB (100.7 MB), near the ~98 MB of the published study"
    sizes = {"full": 512, "small": 128, "tiny": 16}
    tolerance = (1e-5, 1e-2)
    check_size = 128
    layers = 32
    iterations = 100

    def coefficients(self, size: int) -> dict[str, float]:
        nx = ny = size
        dx, dy, dz = CHIP_HEIGHT / nx, CHIP_WIDTH / ny, T_CHIP / self.layers
        cap = FACTOR_CHIP * SPEC_HEAT_SI * T_CHIP * dx * dy
        rx, ry, rz = dy / (2.0 * K_SI * T_CHIP * dx), dx / (2.0 * K_SI * T_CHIP * dy), dz / (K_SI * dx * dy)
        sdc = STEP / cap
        ce, cn, ct = sdc / rx, sdc / ry, sdc / rz
        return {"sdc": sdc, "ce": ce, "cn": cn, "ct": ct, "cc": 1.0 - (2.0 * ce + 2.0 * cn + 3.0 * ct)}

    def inputs(self, size, rng):
        return _thermal_inputs((self.layers, size, size), rng)

    def compute(self, torch, x, size):
        """In place on two buffers (no temporaries), so the footprint is temp in + temp out + power."""
        c = self.coefficients(size)
        t, p = x["temp"], x["power"]
        out = torch.empty_like(t)
        for _ in range(self.iterations):
            torch.mul(t, c["cc"], out=out)
            for dim, coef in ((2, c["ce"]), (1, c["cn"]), (0, c["ct"])):
                n = t.shape[dim]
                # neighbour below (index - 1, clamped) and above (index + 1, clamped)
                out.narrow(dim, 1, n - 1).add_(t.narrow(dim, 0, n - 1), alpha=coef)
                out.narrow(dim, 0, 1).add_(t.narrow(dim, 0, 1), alpha=coef)
                out.narrow(dim, 0, n - 1).add_(t.narrow(dim, 1, n - 1), alpha=coef)
                out.narrow(dim, n - 1, 1).add_(t.narrow(dim, n - 1, 1), alpha=coef)
            out.add_(p, alpha=c["sdc"]).add_(c["ct"] * AMB_TEMP)
            t, out = out, t
        return {"temp": t}

    def reference(self, x, size):
        c = self.coefficients(size)
        t, p = x["temp"].astype(np.float64), x["power"].astype(np.float64)
        for _ in range(self.iterations):
            g = np.pad(t, 1, mode="edge")
            t = (c["cc"] * t + c["ce"] * (g[1:-1, 1:-1, :-2] + g[1:-1, 1:-1, 2:])
                 + c["cn"] * (g[1:-1, :-2, 1:-1] + g[1:-1, 2:, 1:-1]) + c["ct"] * (g[:-2, 1:-1, 1:-1] + g[2:, 1:-1, 1:-1])
                 + c["sdc"] * p + c["ct"] * AMB_TEMP)
        return {"temp": t}


@register_app
class Srad(App):
    name = "srad"
    summary = "speckle-reducing anisotropic diffusion of an image (Rodinia srad v2), 20 iterations"
    size_meaning = "image side (size x size pixels)"
    sizes = {"full": 2048, "small": 512, "tiny": 32}
    tolerance = (1e-3, 1e-4)
    check_size = 512
    iterations = 20
    lam = 0.5

    def inputs(self, size, rng):
        return {"image": np.exp(rng.random((size, size))).astype(np.float32)}

    @staticmethod
    def _step(xp, j, cat):
        """One iteration with array module xp (numpy or torch); cat(a, b, axis) joins arrays."""
        mean = j.mean()
        var = (j * j).mean() - mean * mean
        q0sqr = var / (mean * mean)
        dn = cat(j[:1], j[:-1], 0) - j
        ds = cat(j[1:], j[-1:], 0) - j
        dw = cat(j[:, :1], j[:, :-1], 1) - j
        de = cat(j[:, 1:], j[:, -1:], 1) - j
        g2 = (dn * dn + ds * ds + dw * dw + de * de) / (j * j)
        lap = (dn + ds + dw + de) / j
        num = 0.5 * g2 - (1.0 / 16.0) * (lap * lap)
        den = 1.0 + 0.25 * lap
        qsqr = num / (den * den)
        den = (qsqr - q0sqr) / (q0sqr * (1.0 + q0sqr))
        c = xp.clip(1.0 / (1.0 + den), 0.0, 1.0)
        cs = cat(c[1:], c[-1:], 0)
        ce = cat(c[:, 1:], c[:, -1:], 1)
        return j + 0.25 * Srad.lam * (c * dn + cs * ds + c * dw + ce * de)

    def compute(self, torch, x, size):
        j = x["image"]
        for _ in range(self.iterations):
            j = self._step(torch, j, lambda a, b, axis: torch.cat((a, b), axis))
        return {"image": j}

    def reference(self, x, size):
        j = x["image"].astype(np.float64)
        for _ in range(self.iterations):
            j = self._step(np, j, lambda a, b, axis: np.concatenate((a, b), axis))
        return {"image": j}
