"""The MPS advisor's prediction, from each job's solo window.

Work is counted as in `gpuvs share --with`: the sum over both jobs of (rate together / rate alone);
2.0 means both ran at full speed, 1.0 is what taking turns gives.

- Time-slicing gives each context the GPU in turns; a context with nothing queued yields, so the
  jobs' busy *time* adds up: work_sliced = 2 / max(1, busy_A + busy_B), busy = GPM SM activity where
  there is GPM (read inside the window), else NVML utilisation (the share of time some kernel ran); when the two contend (busy_A + busy_B > 1) the context switches
  cost a further SLICE_LOSS (0.91: two ResNet-50 jobs time-sliced on an H100 did 0.91 of one alone,
  BENCHMARKS.md, issue 7).
- MPS runs both jobs' kernels at once, so what adds up is how much of the GPU each one *fills*:
  work_mps = 2 / max(1, max over resources of (fill_A + fill_B)), with the resources SM occupancy
  (resident warps over the most the SMs hold), tensor-pipe activity and DRAM bandwidth, read with
  NVML GPM. A job can keep the GPU busy 90% of the time while filling 20% of it.
- Prediction: "mps helps" when work_mps / work_sliced > 1 + margin, "mps hurts" below 1 - margin,
  else "no difference"; "will not fit" when the solo footprints add up to more than 95% of memory.

Without GPM (GPUs before Hopper, a driver without it) the only per-job load NVML gives is time-based,
so fill = busy time and the model can only say "no difference" (or "will not fit"): it says so.
It has no term for cache thrashing between concurrent kernels, so it cannot predict "mps hurts"
(docs/sharing.md: where it is wrong)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FILL = ("sm_occupancy", "tensor_active", "dram_active")
SLICE_LOSS = 0.91


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
        sums = {k: fills[0][0][k] + fills[1][0][k] for k in FILL}
        worst = max(sums, key=sums.get)
        work_mps = 2.0 / max(1.0, sums[worst])
        reasons.append("fill alone (GPM): " + "; ".join(f"{k} {100 * fills[0][0][k]:.0f}% + {100 * fills[1][0][k]:.0f}%"
                                                        for k in FILL))
        reasons.append(f"under MPS the tightest resource is {worst} at {100 * sums[worst]:.0f}%: work {work_mps:.2f}")
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
