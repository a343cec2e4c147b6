"""Sharing's tables and figures: gpuvs share (scaling, pairs, capacity), share-matrix and advise-mps.

Each table is made from the studies' typed results.
A figure over repeated groups reads 'mean [low, high]'; a ratio of two arms has its interval and verdict."""

from __future__ import annotations

from gpuvs.report.fit import Table

from gpuvs.report.numbers import fmt
from gpuvs.sharing import share_stats as sharestats
from gpuvs.sharing import studies
from gpuvs.sharing.advisor import PairRuns, mean, verdicts
from gpuvs.sharing.group import Group, normalized_sum
from gpuvs.spec import RunSpec
from gpuvs.sharing.share_stats import Figure, MpsVerdict
from gpuvs.analysis.stats import Comparison


def figure_text(f: Figure, digits: int = 1) -> str:
    if f.mean is None:
        return "-"
    if f.low is None:
        return fmt(f.mean, digits)
    return f"{fmt(f.mean, digits)} [{fmt(f.low, digits)}, {fmt(f.high, digits)}]"


def ratio_text(c: Comparison | MpsVerdict) -> str:
    if c.ratio is None:
        return "-"
    if c.ci_low is None:
        return f"{fmt(c.ratio, 3)} ({c.reason or 'no interval'})"
    return f"{fmt(c.ratio, 3)} [{fmt(c.ci_low, 3)}, {fmt(c.ci_high, 3)}] {c.verdict}"


def memory_text(group, total: float | None) -> str:
    """GPU memory used by a sharing group, MiB, with its share of the GPU's total."""
    if group.memory_used_mib is None:
        return "-"
    pct = f" ({100 * group.memory_used_mib / total:.0f}%)" if total else ""
    return f"{group.memory_used_mib:.0f}{pct}"


def scaling_table(base: RunSpec, so, found: studies.Scaling, total) -> Table:
    """gpuvs share's table: K workers of one job sharing the GPU, per arm, against one worker alone."""
    arms, runs, base_runs = found.arms, found.runs, found.base_runs
    alone = [g.aggregate for g in base_runs]
    t = Table(title=f"{base.workload} sharing one GPU ({so['duration']:g} s window, {so['repeats']} repeat(s))",
              title_justify="left")
    for col in ("workers", "arm", "per worker (mean)", "aggregate", "vs alone", "fairness", "GPU memory MiB",
                "MPS clients"):
        t.add_column(col, justify="left" if col == "arm" else "right")
    unit = ""
    for (arm_label, k), groups in runs.items():
        ok = [g for g in groups if g.ok]
        unit = unit or next((g.unit() for g in ok), "")
        per = sharestats.figure([sum(g.values()) / len(g.values()) for g in ok])
        vs = sharestats.compare(alone, [g.aggregate for g in groups], so["margin"]) if groups is not base_runs else None
        last = groups[-1]
        t.add_row(str(k), arm_label, figure_text(per) if ok else "failed",
                  figure_text(sharestats.figure([g.aggregate for g in ok])), ratio_text(vs) if vs else "1 (base)",
                  figure_text(sharestats.figure([g.fairness for g in ok]), 3), memory_text(last, total),
                  "-" if last.clients_attached is None else str(last.clients_attached))
    t.caption = (f"unit: {unit}; mean [95% interval] over repeats; fairness = slowest / fastest worker; vs alone = "
                 f"aggregate / one worker alone ({arms[0].label}), with compare's verdict (equivalent within "
                 f"±{100 * so['margin']:g}%)")
    return t


def pairs_table(a: RunSpec, b: RunSpec, so, found: studies.Interference, total) -> Table:
    """gpuvs share --with's table: A and B alone and together, per arm, with the work done."""
    arms, alone, together, work = found.arms, found.alone, found.together, found.work
    latency = any(sharestats.latency_ms(g.trials[0].samples) for g in alone["A alone"] if g.trials)
    t = Table(title=f"interference: A = {a.workload}, B = {b.workload} ({so['repeats']} repeat(s))",
              title_justify="left")
    cols = ["run", "A", "B"] + (["A p50 ms", "A p99 ms"] if latency else []) + ["work", "vs " + arms[0].label,
                                                                                   "GPU memory MiB"]
    for col in cols:
        t.add_column(col, justify="left" if col == "run" else "right")

    def lat(groups: list[Group], key: str) -> str:
        vals = [getattr(sharestats.latency_ms(g.trials[0].samples), key, None) for g in groups if g.ok]
        return figure_text(sharestats.figure(vals), 2)

    for label, groups in alone.items():
        fig = figure_text(sharestats.figure([g.value(0) for g in groups]))
        row = [label, fig if label[0] == "A" else "-", fig if label[0] == "B" else "-"]
        row += [lat(groups, "p50"), lat(groups, "p99")] if latency and label[0] == "A" else (["-", "-"] if latency else [])
        t.add_row(*row, "-", "-", memory_text(groups[-1], total))
    for arm in arms:
        groups = together[arm.label]
        row = [f"A+B, {arm.label}", figure_text(sharestats.figure([g.value(0) for g in groups])),
               figure_text(sharestats.figure([g.value(1) for g in groups]))]
        if latency:
            row += [lat(groups, "p50"), lat(groups, "p99")]
        vs = sharestats.compare(work[arms[0].label], work[arm.label], so["margin"]) if arm is not arms[0] else None
        t.add_row(*row, figure_text(sharestats.figure(work[arm.label]), 3), ratio_text(vs) if vs else "-",
                  memory_text(groups[-1], total))
    t.caption = ("mean [95% interval] over repeats; work = sum over both jobs of together/alone (1.0 = what taking "
                 "turns gives; above 1, sharing did more work); vs = work ratio against the first arm with compare's "
                 f"verdict (equivalent within ±{100 * so['margin']:g}%)"
                 + ("; latency = per-batch time of A (CUDA events between consecutive batches)" if latency else ""))
    return t


def capacity_table(base: RunSpec, so, sweeps: list[studies.CapacitySweep], total) -> Table:
    """gpuvs share --capacity's table: instances added one at a time until one fails."""
    t = Table(title=f"capacity: {base.workload} instances added one at a time ({so['duration']:g} s window each)",
              title_justify="left")
    for col in ("unit", "arm", "instances", "GPU memory MiB", "per instance: ms per step (mean, min–max)",
                "aggregate", "vs 1 instance", "MPS clients"):
        t.add_column(col, justify="left" if col in ("unit", "arm") else "right")
    unit_name = ""
    for sweep in sweeps:
        unit, arm, cap = sweep.unit, sweep.arm, sweep.run
        first = cap.measured()[0].aggregate if cap.measured() else None
        for st in cap.measured():
            unit_name = unit_name or st.unit
            ms = [1e3 / r for r in st.rates if r]
            t.add_row(unit, arm.label, str(st.count), memory_text(st, total),
                      f"{fmt(sum(ms) / len(ms), 2)} ({fmt(min(ms), 2)}–{fmt(max(ms), 2)})" if ms else "-",
                      fmt(st.aggregate), fmt(st.aggregate / first, 3) if first else "-",
                      "-" if st.clients_attached is None else str(st.clients_attached))
        stop = (f"instance {cap.failed_at} failed (below)" if cap.failed_at is not None
                else f"cap of {so['max_workers']} reached")
        t.add_row(unit, arm.label, "stop", "", stop, "", "", "")
    t.caption = (f"aggregate in {unit_name or 'steps/sec'}; ms per step = 1000 / an instance's rate in that window; "
                 "GPU memory = NVML memory used on the GPU during the window (the whole GPU: other users too)")
    return t


def capacity_lines(so, sweeps: list[studies.CapacitySweep]) -> list[str]:
    """What each capacity sweep reached, a line each, below its table."""
    lines = []
    for sweep in sweeps:
        unit, arm, cap = sweep.unit, sweep.arm, sweep.run
        lines.append((f"{unit}es" if unit == "process" else f"{unit}s")
                     + f", {arm.label}: largest count that ran: {len(cap.measured())}; "
                     + (f"first failure at instance {cap.failed_at}: {cap.failure}" if cap.failed_at is not None
                        else f"no failure up to the cap of {so['max_workers']}"))
    return lines


def advise_pairs_table(pairs: list[PairRuns], total, margin: float) -> tuple[Table, str]:
    """advise-mps --pairs: each pair's prediction against its measured verdict; and the hit rate line."""
    t = Table(title=f"advise-mps: predicted against measured, {len(pairs)} pairs", title_justify="left")
    for col in ("A", "B", "from", "predicted MPS / sliced", "prediction", "measured MPS / sliced [95%]",
                "measured", "hit"):
        t.add_column(col, justify="left" if col in ("A", "B", "from", "prediction", "measured") else "right")
    hits = settled = 0
    for pr in pairs:
        _, advice, verdict = verdicts(pr, total, margin)
        words = verdict.words if verdict and verdict.ratio is not None else "no verdict"
        hit = "-" if words in ("inconclusive", "no verdict") else ("yes" if words == advice.prediction else "NO")
        settled += hit != "-"
        hits += hit == "yes"
        t.add_row(pr.a, pr.b, advice.source, fmt(advice.ratio, 2), advice.prediction,
                  ratio_text(verdict) if verdict else "-", words, hit)
    t.caption = (f"hit rate: {hits} of {settled} pairs with a measured verdict"
                 f"{'' if settled == len(pairs) else f' ({len(pairs) - settled} inconclusive or not measured)'}; "
                 f"verdict margin ±{100 * margin:g}%")
    return t, f"hit rate: {hits}/{settled}"


def advise_table(jobs, runs: dict[str, list[Group]], work, total) -> Table:
    """advise-mps on one pair: the runs alone and together with their GPU activity."""
    t = Table(title=f"advise-mps: A = {jobs[0]}, B = {jobs[1]} (mean [95% interval] over repeats)",
              title_justify="left")
    for col in ("run", "A", "B", "work", "GPU busy %", "SM occupancy %", "tensor %", "DRAM %", "GPU memory MiB"):
        t.add_column(col, justify="left" if col == "run" else "right")
    for label, groups in runs.items():
        if not groups:
            continue
        two = label.startswith("A+B")
        a_vals = [g.value(0) for g in groups] if label != "B alone" else []
        b_vals = [g.value(1) if two else g.value(0) for g in groups] if label != "A alone" else []
        gpm = [g.gpm or {} for g in groups]
        t.add_row(label, figure_text(sharestats.figure(a_vals)), figure_text(sharestats.figure(b_vals)),
                  figure_text(sharestats.figure(work[label]), 3) if two else "-",
                  fmt(mean(g.telemetry.get("util_gpu_mean") for g in groups)),
                  *(fmt(mean(x.get(k) for x in gpm)) for k in ("sm_occupancy", "tensor_active", "dram_active")),
                  memory_text(groups[-1], total))
    t.caption = "work = sum over both jobs of together/alone; GPM columns (solo runs) need a Hopper or later GPU"
    return t


def matrix_table(name: str, window: float, key: str | None, rows) -> Table:
    """gpuvs share-matrix's table: time per run of each job alone, together time-sliced and under MPS."""
    t = Table(title=f"{name}: time per run, alone and together ({window:g} s windows)",
              title_justify="left")
    for col in ["A", "B", key or "-", "A alone", "B alone", "A+B: A", "A+B: B", "MPS: A", "MPS: B",
                "work time-sliced", "work MPS"]:
        t.add_column(col, justify="left" if col in ("A", "B") else "right")

    def per_run(rate: float | None, unit: str) -> str:
        return fmt(1000.0 / rate, 3) if rate else "-"

    for row in rows:
        alone, unit = row.alone, row.unit
        sliced, mps = row.together.get(False), row.together.get(True)
        t.add_row(row.case.a_text, row.case.b_text, str(row.case.value), per_run(alone[0], unit), per_run(alone[1], unit),
                  per_run(sliced.value(0), unit) if sliced else "-", per_run(sliced.value(1), unit) if sliced else "-",
                  per_run(mps.value(0), unit) if mps else "-", per_run(mps.value(1), unit) if mps else "-",
                  fmt(normalized_sum(sliced, alone), 3) if sliced else "-",
                  fmt(normalized_sum(mps, alone), 3) if mps else "-")
    t.caption = ("times in ms per run of each job (1000 / runs per second, from the shared window); work = sum over "
                 "both jobs of together/alone: 1.0 is what taking turns gives, above 1 sharing did more work")
    return t
