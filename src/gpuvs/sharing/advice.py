"""The MPS advisor's prediction, from each job's solo window.

Work is counted as in `gpuvs share --with`: the sum over both jobs of (rate together / rate alone);
2.0 means both ran at full speed, 1.0 is what taking turns gives.

- Time-slicing gives each context the GPU in turns; a context with nothing queued yields, so the
  jobs' busy *time* adds up: work_sliced = 2 / max(1, busy_A + busy_B), busy = GPM SM activity where
  there is GPM (read inside the window), else NVML utilisation (the share of time some kernel ran); when the two contend (busy_A + busy_B > 1) the context switches
  cost a further SLICE_LOSS (0.91: two ResNet-50 jobs time-sliced on an H100 did 0.91 of one alone,
  BENCHMARKS.md, issue 7).
- MPS, where there is GPM: the jobs' busy times still decide. When they add up to no more than the
  GPU (busy_A + busy_B <= 1) taking turns already runs both at full speed and MPS has nothing to give:
  ratio 1. When they contend, MPS saves the context switches and overlaps the jobs' kernel tails and
  launch gaps: work_mps = work_sliced * MPS_GAIN, with MPS_GAIN = 1.134 the geometric mean of the
  measured MPS / time-sliced ratios of the five contending pairs of issue 15's eight (H100; fitted on
  those eight, checked on 13 held-out pairs: BENCHMARKS.md, issue 37; tests/data/advisor-pairs-h100.json).
- The rule before issue 37 added GPM's fills (SM occupancy, tensor and DRAM activity) and credited MPS
  with 2 / max(fill sums): it overstated by 34-85% where the fills were low, because SM occupancy counts
  resident warps, not the issue slots, shared memory and registers a second job could take (an fp32
  4096^3 GEMM fills 12% of the warps and every SM: two of them gained 1.15 under MPS, predicted 2.07).
  The fills are still read and reported, not used in the ratio: on the 21 recorded pairs they did not
  tell the pairs that gained from those that did not.
- Prediction: "mps helps" when work_mps / work_sliced > 1 + margin, "mps hurts" below 1 - margin,
  else "no difference"; "will not fit" when the solo footprints add up to more than 95% of memory.

Without GPM (GPUs before Hopper, a driver without it) the only per-job load NVML gives is time-based
(NVML utilisation, which counts any kernel running as busy): MPS is credited only with the context
switches it saves (1 / SLICE_LOSS where the busy times add up to more than the GPU), and it says so.
Where it is wrong (docs/sharing.md, BENCHMARKS.md issue 37): it has no term for cache or bandwidth
thrashing between concurrent kernels, so it never predicts "mps hurts" (pathfinder beside hotspot3D:
0.80; ResNet-18 training beside a copy: 0.935, predicted 1.13), nor for how badly time-slicing packs two
jobs that are each busy under half the time (two ResNet-18 bs 64 training jobs: MPS gave 1.27 where it
predicts 1.00)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FILL = ("sm_occupancy", "tensor_active", "dram_active")
SLICE_LOSS = 0.91
# MPS / time-sliced work for two jobs whose GPM busy times add up to more than the GPU: the geometric mean of
# the five such pairs among issue 15's eight on an H100 (1.128, 1.237, 1.106, 1.111, 1.096; BENCHMARKS.md
# "the GPM advisor", replayed from tests/data/advisor-pairs-h100.json, role "fit")
MPS_GAIN = 1.134


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
        if busy_sum > 1.0:
            work_mps = work_sliced * MPS_GAIN
            reasons.append(f"busy together {100 * busy_sum:.0f}% of the time: MPS saves the switches and overlaps "
                           f"the jobs' gaps, x{MPS_GAIN} (fitted on issue 15's H100 pairs): work {work_mps:.2f}")
        else:
            work_mps = work_sliced
            reasons.append(f"busy together {100 * busy_sum:.0f}% of the time: taking turns already runs both at "
                           f"full speed, MPS has nothing to add: work {work_mps:.2f}")
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
