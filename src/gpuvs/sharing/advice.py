"""The MPS advisor's prediction, from each job's solo window (the rule, and how it was chosen: docs/sharing.md).

Work is the sum over both jobs of (rate together / rate alone): 2.0 is both at full speed, 1.0 taking turns.
Time-sliced, the jobs' busy times add up; MPS gains with how much both want the GPU and both stream memory.
Without GPM, MPS is credited only with the context switches it saves, and the advice says so."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FILL = ("sm_occupancy", "tensor_active", "dram_active")
SLICE_LOSS = 0.91  # contending time-sliced contexts lose this to switches: two ResNet-50s on an H100 did 0.91 of one
# MPS / time-sliced work = 1 + RAMP * min(1, SM busy sum) + BOTH_DRAM * min(DRAM A, DRAM B): least squares on
# (measured - 1) over the 21 H100 pairs of tests/data/advisor-pairs-h100.json (benchmarks/advisor_fit.py --loo)
RAMP = 0.0946
BOTH_DRAM = 0.0575


@dataclass
class Advice:
    prediction: str  # "mps helps" | "mps hurts" | "no difference" | "will not fit"
    reasons: list[str]
    source: str = "none"  # "gpm" | "nvml-utilisation" | "none"
    work_sliced: float | None = None
    work_mps: float | None = None
    fills: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        return self.work_mps / self.work_sliced if self.work_mps and self.work_sliced else None


def _fills(telemetry: dict[str, Any], gpm: dict[str, float] | None) -> tuple[dict[str, float], str]:
    if gpm and all(gpm.get(k) is not None for k in FILL):
        return {k: gpm[k] / 100.0 for k in FILL}, "gpm"
    busy = telemetry.get("util_gpu_mean")
    mem = telemetry.get("util_mem_mean")
    if busy is None:
        return {}, "none"
    out = {"busy_time": busy / 100.0}
    if mem is not None:
        out["memory_controller"] = mem / 100.0
    return out, "nvml-utilisation"


def mps_gain(busy_sum: float, dram_min: float) -> float:
    """MPS / time-sliced work from the two jobs' GPM SM activity summed and the lower of their DRAM activity
    (fractions of the GPU)."""
    return 1.0 + RAMP * min(1.0, busy_sum) + BOTH_DRAM * dram_min


def predict(solo: list[tuple[dict[str, Any], dict[str, float] | None, float | None]], total_mib: float | None,
            margin: float) -> Advice:
    """solo: for each job (telemetry summary, GPM percentages or None, memory used MiB or None)."""
    mem = [m or 0.0 for _, _, m in solo]
    if total_mib and sum(mem) > 0.95 * total_mib:
        return Advice("will not fit", [f"memory alone: {mem[0]:.0f} + {mem[1]:.0f} MiB of {total_mib:.0f} MiB"])
    busy = [t.get("util_gpu_mean") for t, _, _ in solo]
    if any(b is None for b in busy):
        return Advice("no difference", ["no GPU telemetry (NVML absent or CPU run): nothing to predict from"])
    fills = [_fills(t, g) for t, g, _ in solo]
    source = "gpm" if all(src == "gpm" for _, src in fills) else "nvml-utilisation"
    if source != "gpm":
        fills = [_fills(t, None) for t, _, _ in solo]
    if source == "gpm" and all(g and g.get("sm_active") is not None for _, g, _ in solo):
        # GPM is read inside the window; NVML's utilisation sampler also covers the moments around it
        busy = [g["sm_active"] for _, g, _ in solo]
    busy_sum = sum(busy) / 100.0
    work_sliced = 2.0 / max(1.0, busy_sum) * (SLICE_LOSS if busy_sum > 1.0 else 1.0)
    what = "GPM SM activity" if source == "gpm" else "NVML"
    reasons = [f"busy time alone ({what}): {busy[0]:.0f}% and {busy[1]:.0f}%: time-sliced work {work_sliced:.2f}"
               + (f" (with the context-switch loss {SLICE_LOSS})" if busy_sum > 1.0 else "")]
    if source == "gpm":
        reasons.append("fill alone (GPM; reported, not used: occupancy counts resident warps, not the room a "
                       "second job has): " + "; ".join(f"{k} {100 * fills[0][0][k]:.0f}% + "
                                                       f"{100 * fills[1][0][k]:.0f}%" for k in FILL))
        dram = min(g["dram_active"] for _, g, _ in solo) / 100.0
        gain = mps_gain(busy_sum, dram)
        work_mps = min(2.0, work_sliced * gain)
        if work_mps < work_sliced * gain:
            work_sliced = work_mps / gain
            reasons.append(f"taking turns falls short of both at full speed: the jobs' gaps do not interleave "
                           f"(time-sliced work {work_sliced:.2f})")
        reasons.append(f"busy together {100 * busy_sum:.0f}% of the time, both streaming memory {100 * dram:.0f}%: "
                       f"MPS overlaps the jobs' gaps, x{gain:.3f} = 1 + {RAMP} x {min(1.0, busy_sum):.2f} + "
                       f"{BOTH_DRAM} x {dram:.2f} (fitted on 21 H100 pairs): work {work_mps:.2f}")
    else:
        work_mps = 2.0 / max(1.0, busy_sum)
        reasons.append("no GPM here: the only per-job load is time-based, which cannot tell a job that fills the GPU "
                       "from one that keeps a corner of it busy; MPS is credited only with saving the context "
                       "switches")
    ratio = work_mps / work_sliced
    prediction = "mps helps" if ratio > 1 + margin else "mps hurts" if ratio < 1 - margin else "no difference"
    reasons.append(f"predicted work with MPS / time-sliced: {ratio:.2f} (margin ±{100 * margin:g}%)")
    return Advice(prediction, reasons, source, work_sliced, work_mps,
                  {f"job{i}": f for i, (f, _) in enumerate(fills)})
