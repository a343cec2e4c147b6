"""What a Rodinia-style application is here: random inputs (NumPy) and the computation written once in PyTorch.

So the same code runs on a GPU and, for real, on the CPU. A NumPy reference and a check that the two agree."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

Arrays = dict[str, np.ndarray]
APPS: dict[str, App] = {}


def register_app(cls: type[App]) -> type[App]:
    APPS[cls.name] = cls()
    return cls


@dataclass
class CheckResult:
    ok: bool
    error: float  # the measure the app compares with its tolerance
    detail: str


class App:
    name: ClassVar[str]
    summary: ClassVar[str]
    size_meaning: ClassVar[str]
    # problem size per scale: full (GPU default), small (CPU default), tiny (tests)
    sizes: ClassVar[dict[str, int]]
    # the NumPy reference is run at min(size, check_size) so that a check stays quick
    check_size: ClassVar[int] = 1 << 40
    # how results are compared with the reference: (rtol, atol), or None for integer results (exact)
    tolerance: ClassVar[tuple[float, float] | None] = (1e-4, 1e-5)

    def inputs(self, size: int, rng: np.random.Generator) -> Arrays:
        raise NotImplementedError

    def compute(self, torch, x: dict[str, Any], size: int) -> dict[str, Any]:
        """The device computation on tensors already on the device; returns tensors."""
        raise NotImplementedError

    def reference(self, x: Arrays, size: int) -> Arrays:
        raise NotImplementedError

    def compare(self, out: Arrays, ref: Arrays) -> CheckResult:
        """Every output within the app's tolerance of the reference, or identical to it."""
        if self.tolerance is None:
            return exact(out, ref)
        return close(out, ref, *self.tolerance)


def close(out: Arrays, ref: Arrays, rtol: float, atol: float) -> CheckResult:
    """Largest |out - ref| / (atol + rtol |ref|) over all outputs; ok when at most 1."""
    worst, where = 0.0, ""
    for key, expected in ref.items():
        got = out.get(key)
        if got is None or np.shape(got) != np.shape(expected):
            return CheckResult(False, float("inf"), f"{key}: shape {np.shape(got)} instead of {np.shape(expected)}")
        e = np.asarray(expected, dtype=np.float64)
        ratio = np.abs(np.asarray(got, dtype=np.float64) - e) / (atol + rtol * np.abs(e))
        value = float(np.nanmax(ratio)) if ratio.size else 0.0
        if not np.all(np.isfinite(got)):
            value = float("inf")
        if value > worst or where == "":
            worst, where = value, key
    return CheckResult(worst <= 1.0, worst, f"{where}: largest error {worst:.3g} of the tolerance "
                       f"(rtol {rtol:g}, atol {atol:g})")


def exact(out: Arrays, ref: Arrays) -> CheckResult:
    for key, expected in ref.items():
        got = out.get(key)
        if got is None or np.shape(got) != np.shape(expected):
            return CheckResult(False, float("inf"), f"{key}: shape {np.shape(got)} instead of {np.shape(expected)}")
        bad = int(np.count_nonzero(np.asarray(got) != np.asarray(expected)))
        if bad:
            return CheckResult(False, float(bad), f"{key}: {bad} of {np.size(expected)} values differ")
    return CheckResult(True, 0.0, "identical")
