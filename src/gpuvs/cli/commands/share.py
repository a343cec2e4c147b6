"""gpuvs share: K workers on one GPU in one measured window (MPS off, on or both), mixed pairs,
and the capacity search. The studies are gpuvs.sharing.studies'; this module parses and renders."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from gpuvs.cli import common, options
from gpuvs.cli.command import Args, Command, Positional
from gpuvs.cli.command import Group as Options
from gpuvs.errors import UsageError
from gpuvs.params import Param
from gpuvs.store.records import ExperimentMeta
from gpuvs.report.sharing import figure_text, ratio_text
from gpuvs.report.numbers import fmt
from gpuvs.trial.runner import Runner, validate_spec
from gpuvs.safetext import safe_text
from gpuvs.sharing import knobs, studies
from gpuvs.sharing import stats as sharestats
from gpuvs.sharing.group import Coordinator, Group, check_shareable, gpu_memory_total_mib
from gpuvs.spec import RunSpec
from gpuvs.analysis.stats import SeriesSummary
from gpuvs.store.db import Store

SHARE_OPTIONS = (
    Param("workers", str, "1,2", "worker counts to measure, e.g. 1,2,4"),
    Param("mps", str, "off", "run with the MPS daemon off, on, or both", choices=("off", "on", "both")),
    Param("duration", float, 20.0, "seconds of the shared measurement window", min=0.5, max=86400),
    Param("with", str, None, "a second job to pair with, quoted: \"WORKLOAD --param value ...\""),
    Param("capacity", bool, False, "add instances one at a time, each measured count a window, until one fails"),
    Param("max_workers", int, 32, "upper bound of the capacity search", min=1, max=512),
    Param("also_host", bool, False, "with --capacity and --env container: the same sweep with plain processes"),
    Param("ready_timeout", float, 900.0, "seconds a worker may take to warm up before the window", min=1),
    Param("repeats", int, 3, "fresh process groups per configuration (intervals and verdicts need 2 or more)",
          min=1, max=1000),
    Param("margin", float, 0.05, "ratio difference under which two arms count as equivalent", min=0, max=0.9),
    Param("mps_threads", str, None, "MPS arms with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE per client: a comma list of "
          "P (every worker) or PA:PB (--with pairs), e.g. 50,30:70"),
    Param("mps_mem_limit", str, None, "an MPS arm with CUDA_MPS_PINNED_DEVICE_MEM_LIMIT per client: SIZE (every "
          "worker) or SIZE_A:SIZE_B, e.g. 4G or 2G:40G"),
)


def parse_counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or any(c < 1 or c > 512 for c in counts):
        raise UsageError(f"--workers wants counts from 1 to 512 separated by commas, e.g. 1,2,4; got {text!r}")
    return counts


def share(args: Args) -> None:
    console = Console(markup=False, highlight=False)
    prep = common.prepare(args, console)
    so = args.group("share")
    base = prep.base
    check_shareable(base)
    validate_spec(base)
    counts = parse_counts(so["workers"])
    other = common.job_spec(so["with"], base) if so["with"] else None
    if other is not None:
        check_shareable(other)
        validate_spec(other)
    if base.device == "cpu" and so["mps"] != "off":
        raise UsageError("--mps applies to GPU runs (--device cuda)")
    if so["also_host"] and (not so["capacity"] or base.env.kind == "host"):
        raise UsageError("--also-host goes with --capacity and --env container (it adds the same sweep on the host)")
    arms = knobs.arms(so["mps"], so["mps_threads"], so["mps_mem_limit"], 2 if other is not None else 1,
                      base.device)
    exp_id = common.experiment_id()
    base.experiment_id = exp_id
    if other is not None:
        other.experiment_id = exp_id
    run = prep.run
    with Store(run["store"]) as store:
        store.create_experiment(exp_id, run["name"] or f"share {base.workload}", "share",
                                ExperimentMeta(base=base, share=so))
        runner = Runner(store, timeout_s=run["timeout"] + so["duration"] + so["ready_timeout"],
                        on_trial_end=lambda r: console.print("  " + _trial_line(r), style=None if r.ok else "red"))
        coord = Coordinator(runner, so["duration"], so["ready_timeout"], say=lambda s: console.print("  " + safe_text(s)))
        total = gpu_memory_total_mib(base.device)

        def heading(text: str) -> None:
            console.rule(text, style="dim")

        if so["capacity"]:
            sweeps = studies.capacity(coord, base, arms, so["max_workers"], so["also_host"], heading)
            capacity_table(console, base, so, sweeps, total)
        elif other is not None:
            found = studies.pairs(coord, base, other, arms, so["repeats"], heading)
            pairs_table(console, base, other, so, found, total)
            studies.raise_if_failed(found.groups())
        else:
            found = studies.scaling(coord, base, counts, arms, so["repeats"], heading)
            scaling_table(console, base, so, found, total)
            studies.raise_if_failed(found.groups())
    console.print(f"stored as experiment {exp_id} in {run['store']}", style="dim")


def _trial_line(r) -> str:
    m = r.primary() or SeriesSummary(n=None)
    if not r.ok:
        return safe_text(f"{r.spec.arm}: worker {r.spec.trial}: {r.status}: {r.error}", lines=True)
    return f"{r.spec.arm}: worker {r.spec.trial}: {fmt(m.value)} {m.unit} over {m.n} steps"


def scaling_table(console, base: RunSpec, so, found: studies.Scaling, total) -> None:
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
                  figure_text(sharestats.figure([g.fairness for g in ok]), 3), common.memory_text(last, total),
                  "-" if last.clients_attached is None else str(last.clients_attached))
    t.caption = (f"unit: {unit}; mean [95% interval] over repeats; fairness = slowest / fastest worker; vs alone = "
                 f"aggregate / one worker alone ({arms[0].label}), with compare's verdict (equivalent within "
                 f"±{100 * so['margin']:g}%)")
    console.print(t)


def pairs_table(console, a: RunSpec, b: RunSpec, so, found: studies.Interference, total) -> None:
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
        t.add_row(*row, "-", "-", common.memory_text(groups[-1], total))
    for arm in arms:
        groups = together[arm.label]
        row = [f"A+B, {arm.label}", figure_text(sharestats.figure([g.value(0) for g in groups])),
               figure_text(sharestats.figure([g.value(1) for g in groups]))]
        if latency:
            row += [lat(groups, "p50"), lat(groups, "p99")]
        vs = sharestats.compare(work[arms[0].label], work[arm.label], so["margin"]) if arm is not arms[0] else None
        t.add_row(*row, figure_text(sharestats.figure(work[arm.label]), 3), ratio_text(vs) if vs else "-",
                  common.memory_text(groups[-1], total))
    t.caption = ("mean [95% interval] over repeats; work = sum over both jobs of together/alone (1.0 = what taking "
                 "turns gives; above 1, sharing did more work); vs = work ratio against the first arm with compare's "
                 f"verdict (equivalent within ±{100 * so['margin']:g}%)"
                 + ("; latency = per-batch time of A (CUDA events between consecutive batches)" if latency else ""))
    console.print(t)


def capacity_table(console, base: RunSpec, so, sweeps: list[studies.CapacitySweep], total) -> None:
    t = Table(title=f"capacity: {base.workload} instances added one at a time ({so['duration']:g} s window each)",
              title_justify="left")
    for col in ("unit", "arm", "instances", "GPU memory MiB", "per instance: ms per step (mean, min … max)",
                "aggregate", "vs 1 instance", "MPS clients"):
        t.add_column(col, justify="left" if col in ("unit", "arm") else "right")
    unit_name = ""
    for sweep in sweeps:
        unit, arm, cap = sweep.unit, sweep.arm, sweep.run
        first = cap.measured()[0].aggregate if cap.measured() else None
        for st in cap.measured():
            unit_name = unit_name or st.unit
            ms = [1e3 / r for r in st.rates if r]
            t.add_row(unit, arm.label, str(st.count), common.memory_text(st, total),
                      f"{fmt(sum(ms) / len(ms), 2)} ({fmt(min(ms), 2)} … {fmt(max(ms), 2)})" if ms else "-",
                      fmt(st.aggregate), fmt(st.aggregate / first, 3) if first else "-",
                      "-" if st.clients_attached is None else str(st.clients_attached))
        stop = (f"instance {cap.failed_at} failed (below)" if cap.failed_at is not None
                else f"cap of {so['max_workers']} reached")
        t.add_row(unit, arm.label, "stop", "", stop, "", "", "")
    t.caption = (f"aggregate in {unit_name or 'steps/sec'}; ms per step = 1000 / an instance's rate in that window; "
                 "GPU memory = NVML memory used on the GPU during the window (the whole GPU: other users too)")
    console.print(t)
    for sweep in sweeps:
        unit, arm, cap = sweep.unit, sweep.arm, sweep.run
        console.print(f"{unit}es" if unit == "process" else f"{unit}s", end="")
        console.print(f", {arm.label}: largest count that ran: {len(cap.measured())}; "
                      + (f"first failure at instance {cap.failed_at}: {cap.failure}" if cap.failed_at is not None
                         else f"no failure up to the cap of {so['max_workers']}"))


COMMAND = Command(
    "share", "Run K workers on one GPU in one shared window (MPS off, on or both), pairs of jobs, or the capacity "
    "search.", share,
    # the command's own options come before the workload's, so they win where names clash (gpuvs share
    # --workers is the number of jobs; the CNN's DataLoader workers are --data-workers there)
    groups=(options.run_group(), *options.env_groups(), Options("share options", SHARE_OPTIONS, "share")),
    positionals=(Positional("workload", workload=True),),
    usage="WORKLOAD [workload options] [run options] [environment options] [share options]",
    help_when_bare=True,
)
