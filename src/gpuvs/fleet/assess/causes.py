"""Why a GPU is slow, from its NVML readings against its peers' (probes/gpu_health.py), as sentences.

Each is one a platform engineer acts on, e.g. "PCIe Gen3 x16 where its peers run Gen5 x16". Pure: readings in, text out.
Nothing is guessed: a cause is named only where the readings show it, and a reading NVML did not give says nothing.
A slow GPU whose readings show nothing says so (NO_CAUSE)."""

from __future__ import annotations

import statistics
from typing import Iterable

from gpuvs.probes.gpu_health import GpuHealth

NO_CAUSE = "no cause visible in NVML's readings"
# clock-event reasons that slow a GPU, as people name them; idle and application-clock settings are not causes
THROTTLE_NAMES = {"hw_slowdown": "HW slowdown", "hw_thermal": "HW thermal slowdown",
                  "sw_thermal": "SW thermal slowdown", "sw_power_cap": "power cap", "hw_power_brake": "HW power brake"}
THROTTLE_SHARE = 0.05  # a reason seen in at least 5% of the readings, 5 points more than in any peer's
OTHER_UTIL_PCT = 1.0  # another process's share of the GPU worth naming (points above the peers')
CLOCK_RATIO = 0.95  # a mean clock below 95% of the peers' median
H2D_RATIO = 0.9  # host-to-device bandwidth below 90% of the peers' median
TEMP_MARGIN_C = 2  # within 2 °C of the slowdown threshold


def _median(values: Iterable[float | None]) -> float | None:
    known = [float(v) for v in values if v is not None]
    return statistics.median(known) if known else None


def _most(values: Iterable[float | None]) -> float | None:
    known = [float(v) for v in values if v is not None]
    return max(known) if known else None


def _link(gen: int | None, width: int | None) -> str:
    return f"Gen{gen} x{width}" if width is not None else f"Gen{gen}"


def _pcie(h: GpuHealth, peers: list[GpuHealth]) -> str | None:
    if h.pcie_gen is None:
        return None
    links = [(p.pcie_gen, p.pcie_width) for p in peers if p.pcie_gen is not None]
    if links:
        gen, width = statistics.mode(links)
        if (h.pcie_gen, h.pcie_width or 0) < (gen, width or 0) and (
                h.pcie_gen < gen or (h.pcie_width is not None and width is not None and h.pcie_width < width)):
            return f"PCIe {_link(h.pcie_gen, h.pcie_width)} where its peers run {_link(gen, width)}"
        return None
    below_gen = h.pcie_gen_max is not None and h.pcie_gen < h.pcie_gen_max
    below_width = h.pcie_width is not None and h.pcie_width_max is not None and h.pcie_width < h.pcie_width_max
    if below_gen or below_width:
        return (f"PCIe {_link(h.pcie_gen, h.pcie_width)}, below the "
                f"{_link(h.pcie_gen_max if h.pcie_gen_max is not None else h.pcie_gen, h.pcie_width_max)} "
                "it and its slot support")
    return None


def _h2d(h2d: float | None, peer_h2d: list[float]) -> str | None:
    peer = _median(peer_h2d)
    if h2d is None or peer is None or h2d >= H2D_RATIO * peer:
        return None
    return f"host-to-device {h2d:.3g} GB/s against {peer:.3g}"


def _others(h: GpuHealth, peers: list[GpuHealth]) -> str | None:
    if not h.other_pids:
        return None
    who = "another process" if len(h.other_pids) == 1 else f"{len(h.other_pids)} other processes"
    pids = ", ".join(str(p) for p in h.other_pids[:3]) + (", ..." if len(h.other_pids) > 3 else "")
    who += f" (pid {pids})"
    peer_util = _most(p.other_util_pct for p in peers) or 0.0
    if h.other_util_pct is not None and round(h.other_util_pct) >= OTHER_UTIL_PCT + peer_util:
        return f"{who} used {h.other_util_pct:.0f}% of the GPU during its trials"
    if any(p.other_pids for p in peers):
        return None
    held = f", holding {h.other_mem_mib:,.0f} MiB," if h.other_mem_mib else ""
    busy = " (busy 0% of the time)" if h.other_util_pct is not None else ""
    return f"{who}{held} on the GPU during its trials{busy}"


def _processes(h: GpuHealth, peers: list[GpuHealth]) -> str | None:
    """Where the worker's own process cannot be told apart (another pid namespace): more processes than peers."""
    if h.other_pids is not None or h.processes is None:
        return None
    counts = [p.processes for p in peers if p.processes is not None]
    if not counts or h.processes <= max(counts):
        return None
    return f"{h.processes} processes on the GPU during its trials where its peers had {max(counts)}"


def _throttle(h: GpuHealth, peers: list[GpuHealth]) -> list[str]:
    out = []
    for reason, name in THROTTLE_NAMES.items():
        share = h.throttle.get(reason, 0.0)
        peer = max([p.throttle.get(reason, 0.0) for p in peers] or [0.0])
        if share >= THROTTLE_SHARE and share - peer >= THROTTLE_SHARE:
            out.append(f"{name} throttling {100 * share:.0f}% of the time")
    return out


def _power(h: GpuHealth, peers: list[GpuHealth]) -> str | None:
    if h.power_limit_w is None or h.power_default_w is None or h.power_limit_w >= h.power_default_w - 1:
        return None
    peer = _median(p.power_limit_w for p in peers)
    if peer is not None and h.power_limit_w >= peer - 1:
        return None
    return f"power limit {h.power_limit_w:.0f} W, default {h.power_default_w:.0f} W"


def _clock(label: str, mine: float | None, theirs: Iterable[float | None], most: int | None) -> str | None:
    peer = _median(theirs)
    if mine is None or peer is None or mine >= CLOCK_RATIO * peer:
        return None
    top = f" (its maximum {most})" if most else ""
    return f"{label} clock {mine:.0f} MHz on average, peers {peer:.0f}{top}"


def _temperature(h: GpuHealth, peers: list[GpuHealth]) -> str | None:
    if h.temp_max_c is None or h.temp_slowdown_c is None or h.temp_max_c < h.temp_slowdown_c - TEMP_MARGIN_C:
        return None
    if any(p.temp_max_c is not None and p.temp_slowdown_c is not None
           and p.temp_max_c >= p.temp_slowdown_c - TEMP_MARGIN_C for p in peers):
        return None
    return f"reached {h.temp_max_c:.0f} °C, its slowdown threshold is {h.temp_slowdown_c} °C"


def _memory_errors(h: GpuHealth, peers: list[GpuHealth]) -> list[str]:
    out = []
    peer_ecc = _most(p.ecc_uncorrected for p in peers) or 0
    if h.ecc_uncorrected and h.ecc_uncorrected > peer_ecc:
        during = (h.ecc_uncorrected - h.ecc_uncorrected_before) if h.ecc_uncorrected_before is not None else None
        out.append(f"{h.ecc_uncorrected} uncorrected ECC errors since the driver loaded"
                   + (f" ({during} during its trials)" if during else ""))
    remapped = (h.remapped_correctable or 0) + (h.remapped_uncorrectable or 0)
    rows = f" ({remapped} rows remapped)" if remapped else ""
    if h.remap_failed:
        out.append(f"row remapping failed{rows}")
    elif h.remap_pending:
        out.append(f"row remapping pending{rows}: applied at the GPU's next reset")
    return out


def _xid(h: GpuHealth) -> str | None:
    if not h.xid:
        return None
    return (f"XID {h.xid[0]}" if len(h.xid) == 1 else "XIDs " + ", ".join(str(x) for x in h.xid)) + \
        " during its trials"


def causes(h: GpuHealth | None, peers: list[GpuHealth], h2d: float | None = None,
           peer_h2d: list[float] | None = None) -> list[str]:
    """The readings of a slow GPU that differ from its peers', as sentences; NO_CAUSE where none does; nothing
    at all where there are no readings (a CPU run, a store of an earlier version)."""
    if h is None:
        return []
    out: list[str] = []
    link, bandwidth = _pcie(h, peers), _h2d(h2d, list(peer_h2d or []))
    if link or bandwidth:
        out.append("; ".join(x for x in (link, bandwidth) if x))
    out += [x for x in (_others(h, peers), _processes(h, peers)) if x]
    out += _throttle(h, peers)
    out += [x for x in (_power(h, peers),
                        _clock("SM", h.sm_clock_mean_mhz, (p.sm_clock_mean_mhz for p in peers), h.sm_clock_max_mhz),
                        _clock("memory", h.mem_clock_mean_mhz, (p.mem_clock_mean_mhz for p in peers),
                               h.mem_clock_max_mhz),
                        _temperature(h, peers)) if x]
    out += _memory_errors(h, peers)
    out += [x for x in (_xid(h),) if x]
    return out or [NO_CAUSE]


SLOW = ("slower", "slower-within-margin")


def for_nodes(verdicts: dict[str, str], health: dict[str, list[GpuHealth]],
              h2d: dict[str, float] | None = None) -> dict[str, list[str]]:
    """Each slow (or slower-within-margin) node's causes, GPU by GPU against every GPU of its peers: the measured
    nodes that are not slow (all the other measured nodes where every one is). A node of several GPUs names
    each ("GPU 1: ..."); a node without readings gets nothing."""
    h2d = h2d or {}
    slow = [n for n, v in verdicts.items() if v in SLOW]
    out: dict[str, list[str]] = {}
    for node in slow:
        if not health.get(node):
            continue
        peer_nodes = [n for n in verdicts if n not in slow and health.get(n)] or \
            [n for n in verdicts if n != node and health.get(n)]
        peers = [g for n in peer_nodes for g in health[n]]
        peer_h2d = [h2d[n] for n in peer_nodes if n in h2d]
        several = len(health[node]) > 1
        lines = []
        for g in health[node]:
            found = causes(g, peers, h2d.get(node) if not several else None, peer_h2d)
            lines += [f"GPU {g.gpu}: {x}" if several else x for x in found]
        out[node] = lines
    return out
