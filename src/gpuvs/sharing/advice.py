"""The MPS advisor's prediction, from each job's solo window.

Work is counted as in `gpuvs share --with`: the sum over both jobs of (rate together / rate alone);
2.0 means both ran at full speed, 1.0 is what taking turns gives.

- Time-slicing gives each context the GPU in turns; a context with nothing queued yields, so the
  jobs' busy *time* adds up: work_sliced = 2 / max(1, busy_A + busy_B), busy = GPM SM activity where
  there is GPM (read inside the window), else NVML utilisation (the share of time some kernel ran); when the two contend (busy_A + busy_B > 1) the context switches
  cost a further SLICE_LOSS (0.91: two ResNet-50 jobs time-sliced on an H100 did 0.91 of one alone,
  BENCHMARKS.md, issue 7).
- MPS, where there is GPM: the ratio work_mps / work_sliced = 1 + RAMP * min(1, busy_A + busy_B)
  + BOTH_DRAM * min(dram_A, dram_B) (GPM SM and DRAM activity, fractions). The gain grows with how much
  of the time the two jobs both want the GPU (jobs that each leave launch gaps do not interleave
  perfectly under time-slicing: two ResNet-18 bs 64 trainings, each busy 42%, gained 1.27), and with how
  much both stream memory. work_mps is capped at 2 (both at full speed); where the cap binds, taking turns
  is what falls short: work_sliced = work_mps / ratio.
- How it was chosen (issue 37): six forms using only the solo GPM readings were written down before any
  was scored (benchmarks/advisor_candidates.py: always 1.00, constant, the step rule before this one,
  ramp, ramp with a term in min(DRAM), ramp with DRAM A x DRAM B), each scored by leave-one-out over the
  21 recorded H100 pairs (tests/data/advisor-pairs-h100.json) and the most pairs on the right side of the
  ±5% margin chosen (15 of 21; ramp alone 14, the step rule 13; within ±15% 17 of 21). RAMP and
  BOTH_DRAM are then least squares on all 21 (measured - 1). The DRAM term was meant to lower the gain
  where both jobs stream memory; its fitted sign is positive (two copies gained 1.11-1.12 under MPS), so
  it does not predict "mps hurts" either. Checked on a second held-out set:
  benchmarks/advisor-heldout2-pairs.yaml.
- The rule before issue 37 added GPM's fills (SM occupancy, tensor and DRAM activity) and credited MPS
  with 2 / max(fill sums): it overstated by 34-85% where the fills were low, because SM occupancy counts
  resident warps, not the issue slots, shared memory and registers a second job could take (an fp32
  4096^3 GEMM fills 12% of the warps and every SM: two of them gained 1.15 under MPS, predicted 2.07).
  Occupancy and tensor activity are still read and reported, not used.
- Prediction: "mps helps" when work_mps / work_sliced > 1 + margin, "mps hurts" below 1 - margin,
  else "no difference"; "will not fit" when the solo footprints add up to more than 95% of memory.

Without GPM (GPUs before Hopper, a driver without it) the only per-job load NVML gives is time-based
(NVML utilisation, which counts any kernel running as busy): MPS is credited only with the context
switches it saves (1 / SLICE_LOSS where the busy times add up to more than the GPU), and it says so.
Where it is wrong (docs/sharing.md, BENCHMARKS.md issue 37): it never predicts below 1, so it never says
"mps hurts" (pathfinder beside hotspot3D: 0.80; two ResNet-18 bs 8 inferences 0.89; ResNet-18 training
beside a copy: 0.935, predicted 1.10); and it undersizes the gain of jobs that leave long gaps (two
ResNet-18 bs 64 trainings: 1.27, predicted 1.09)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FILL = ("sm_occupancy", "tensor_active", "dram_active")
SLICE_LOSS = 0.91
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
