"""Datasheet peaks per GPU model, looked up by the name NVML (and torch) report.

They are NVIDIA's published dense peaks (no 2:4 sparsity) at boost clock, TFLOP/s per precision and memory GB/s.
fp32 is the non-tensor FP32 rate; tf32, fp16, bf16 and fp8 are tensor cores; GB/s is 10^9 bytes/s.
A model that is not in the table gets no percentage: a wrong peak is worse than none."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8")


@dataclass(frozen=True)
class Peaks:
    model: str
    tflops: dict[str, float] = field(default_factory=dict)  # precision -> dense TFLOP/s
    memory_gbps: float | None = None

    def tflops_for(self, precision: str) -> float | None:
        return self.tflops.get(precision)


def _p(model: str, fp32=None, tf32=None, fp16=None, bf16=None, fp8=None, mem=None) -> Peaks:
    rates = {"fp32": fp32, "tf32": tf32, "fp16": fp16, "bf16": bf16, "fp8": fp8}
    return Peaks(model, {k: float(v) for k, v in rates.items() if v is not None}, float(mem) if mem else None)


# (pattern on the lower-cased name, peaks); the first match wins, so specific names come first.
TABLE: list[tuple[str, Peaks]] = [
    (r"\bb200\b", _p("B200", tf32=1125, fp16=2250, bf16=2250, fp8=4500, mem=8000)),
    (r"\bh200 nvl\b", _p("H200 NVL", 60, 417.5, 835.5, 835.5, 1670.5, 4800)),
    (r"\bh200\b", _p("H200 SXM", 66.9, 494.7, 989.4, 989.4, 1978.9, 4800)),
    (r"\bh100 nvl\b", _p("H100 NVL", 60, 417.5, 835.5, 835.5, 1670.5, 3900)),
    (r"\bh100 pcie\b", _p("H100 PCIe", 51.2, 378, 756, 756, 1513, 2000)),
    (r"\bh100\b.*(hbm3|sxm)", _p("H100 SXM", 66.9, 494.7, 989.4, 989.4, 1978.9, 3352)),
    (r"\ba100\b.*sxm.*80\s*gb|\ba100\b.*80\s*gb.*sxm", _p("A100 SXM4 80GB", 19.5, 156, 312, 312, mem=2039)),
    (r"\ba100\b.*80\s*gb", _p("A100 PCIe 80GB", 19.5, 156, 312, 312, mem=1935)),
    (r"\ba100\b", _p("A100 40GB", 19.5, 156, 312, 312, mem=1555)),
    (r"\ba30\b", _p("A30", 10.3, 82, 165, 165, mem=933)),
    (r"\ba10\b", _p("A10", 31.2, 62.5, 125, 125, mem=600)),
    (r"\bl40s\b", _p("L40S", 91.6, 183, 362, 362, 733, 864)),
    (r"\bl40\b", _p("L40", 90.5, 90.5, 181, 181, 362, 864)),
    (r"\bl4\b", _p("L4", 30.3, 60, 121, 121, 242.5, 300)),
    (r"\bt4\b", _p("T4", 8.1, fp16=65, mem=320)),
    (r"\bv100\b.*sxm", _p("V100 SXM2", 15.7, fp16=125, mem=900)),
    (r"\bv100\b", _p("V100 PCIe", 14, fp16=112, mem=900)),
    (r"\bp100\b.*sxm", _p("P100 SXM2", 10.6, fp16=21.2, mem=732)),
]


def lookup(name: str | None) -> Peaks | None:
    """Peaks for a GPU name as NVML reports it ('NVIDIA H100 80GB HBM3'), or None if unknown."""
    if not name:
        return None
    text = re.sub(r"\s+", " ", name.lower().replace("-", " ").replace("_", " "))
    for pattern, peaks in TABLE:
        if re.search(pattern, text):
            return peaks
    return None


def percent(value: float | None, peak: float | None) -> float | None:
    """value as a percentage of peak; None where either is unknown."""
    if value is None or not peak or value != value:
        return None
    return 100.0 * value / peak


def pcie_gbps(generation: int | None, width: int | None) -> float | None:
    """Theoretical one-direction PCIe bandwidth in GB/s after line coding (gen1/2: 8b/10b, gen3+: 128b/130b)."""
    per_lane = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}.get(generation or 0)
    if not per_lane or not width:
        return None
    return per_lane * width
