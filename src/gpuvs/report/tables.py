"""The tables of a comparison report, once, as plain rows of text.

The terminal, markdown and HTML renderers only lay them out, so every format says exactly the same thing."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from gpuvs import events
from gpuvs.analysis import stats
from gpuvs.analysis.comparison import Analysis, fingerprint_rows
from gpuvs.analysis.family import MetricVerdict
from gpuvs.report.numbers import Units, fmt, fmt_all, percent
from gpuvs.safetext import clip
from gpuvs.analysis.stats import TrialsSummary
from gpuvs.analysis.timeshare import LABELS, TimeShares


@dataclass
class Table:
    key: str  # a stable identifier (HTML ids, tests)
    title: str
    columns: list[str]
    rows: list[list[str]]
    note: str = ""
    right: set[int] = field(default_factory=set)  # column indexes aligned right (numbers)
    marked: set[int] = field(default_factory=set)  # row indexes to highlight (fingerprint differences)
    whole: set[int] = field(default_factory=set)  # columns of names and ids people copy: never folded


def ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}×"


def interval(low: float | None, high: float | None, digits: int = 3, positive: bool = False) -> str:
    """'0.949–0.964'; each end with the significant figures that tell the two apart. positive: the quantity
    cannot be below zero (a rate, a time), so an end below zero is clipped to 0 and marked '0†'."""
    if low is None or high is None or low != low or high != high:
        return "-"
    clipped = positive and low < 0
    lo, hi = fmt_all([0.0 if clipped else low, high], digits)
    if clipped:
        lo = "0†"
    return f"{lo}–{hi}" if low >= 0 or clipped else span(lo, hi)


def span(low: str, high: str) -> str:
    """'6.24–38.8'; 'a to b' where an end is negative (a dash before a minus would read as one). Never '…',
    which is what a cut cell ends with."""
    return f"{low} to {high}" if low.startswith("-") or high.startswith("-") else f"{low}–{high}"


CLIPPED_NOTE = ("0†: the interval of the mean reached below zero, which a positive quantity cannot; shown from 0 "
                "(too few trials or too much noise for this interval to say much)")


def verdict_word(v: MetricVerdict) -> str:
    """'faster', 'equivalent within ±2%', '1.5% slower, within ±2%' (slower-within-margin: both hold),
    'inconclusive', 'descriptive'."""
    if v.verdict == "equivalent":
        return f"equivalent within ±{100 * v.margin:g}%"
    if v.verdict.endswith("-within-margin") and v.ratio is not None:
        return f"{100 * abs(v.ratio - 1):.1f}% {v.also or v.verdict.removesuffix('-within-margin')}, within ±{100 * v.margin:g}%"
    return v.verdict


def to_settle(v: MetricVerdict) -> str:
    if v.verdict == "descriptive":
        return "-"
    if v.verdict != "inconclusive":
        return "settled"
    if v.ratio is not None and v.reason.startswith("needs"):
        return f"2+ trials per arm needed ({v.more_trials:,} more)"
    if v.more_trials is None:
        return "more than 10,000 per arm" if v.se_log else (v.reason or "-")
    return f"{v.trials_needed:,} per arm ({v.more_trials:,} more)"


def tested_as(v: MetricVerdict) -> str:
    """How the row was tested: its family and the analysis of the design."""
    if v.method == "paired":
        how = f"paired, {v.n_pairs:,} rounds" + (f" ({v.unused:,} trials unpaired, left out)" if v.unused else "")
    elif v.method == "unpaired":
        how = "unpaired" + ("" if v.interleaved else ", not interleaved")
    else:
        how = "-"
    fam = v.family or ""
    short = "descriptive" if fam.startswith("descriptive") else ("Holm" if fam.startswith("other") else "headline")
    return f"{short}; {how}"


def agreement_note(a: Analysis) -> str:
    """Where a row found equivalent (or within the margin) shows an interval that reaches past the margin:
    the level its equivalence was tested at and the interval that decided it, so the table never shows an
    interval that seems to contradict its verdict."""
    parts = []
    for v in a.verdicts:
        if v.verdict != "equivalent" and not stats.within_margin(v.verdict):
            continue
        if v.ci_low is None or (1 - v.margin <= v.ci_low and v.ci_high <= 1 + v.margin):
            continue
        eq = stats.equivalence_interval(v)
        if eq is None:
            continue
        parts.append(f"{v.arm} on {v.metric}: equivalence was tested by two one-sided tests at "
                     f"{fmt(v.level_eq, 3, 2)} each, which hold exactly when the {fmt(100 * (1 - 2 * v.level_eq), 1, 3)}% "
                     f"interval, {interval(*eq)}, lies inside ±{100 * v.margin:g}%; the "
                     f"{fmt(100 * (1 - v.level), 1, 3)}% interval shown is wider")
    return "; ".join(parts)


def units_of(a: Analysis, units: Units | None = None) -> Units:
    """The one unit of each metric in a's report, chosen from its per-trial figures (what `results show` sees
    too, so both say the same); `units`: the choices already made for this report (a live run's trial lines),
    which stay. Every format's tables and charts take their units from here."""
    units = units if units is not None else Units()
    for m in a.metrics:
        units.of(m.name, m.unit, [v for arm in a.arms for v in arm.values.get(m.name, {}).values()])
    return units


def ratio_cell(v: MetricVerdict) -> str:
    """The ratio and, where paired, its statistic: '0.980× (geometric mean of 5 rounds; of the means 0.917×)',
    the ratio of the means said where it reads otherwise, so that the means beside it never seem to contradict
    it."""
    text = ratio(v.ratio)
    if v.ratio is None or v.method != "paired":
        return text
    text += f" (geometric mean of {v.n_pairs} rounds"
    if v.mean_a and v.mean_b is not None and ratio(v.mean_b / v.mean_a) != ratio(v.ratio):
        text += f"; of the means {ratio(v.mean_b / v.mean_a)}"
    return text + ")"


def verdict_table(a: Analysis, units: Units | None = None) -> Table | None:
    if len(a.arms) < 2 or not a.verdicts:
        return None
    units = units_of(a, units)
    pct = f"{100 * a.confidence:g}%"
    rows = []
    for v in a.verdicts:
        scaled, unit = units.scaled(v.metric, v.unit, [v.mean_a, v.mean_b])
        means = fmt_all(scaled)
        word = verdict_word(v) + (AA_CELL if a.aa and _differs(v) else "")
        rows.append([f"{v.metric} ({unit})" if unit else v.metric, v.arm, *means, ratio_cell(v),
                     interval(v.ci_low, v.ci_high), word, tested_as(v), to_settle(v)])
    head = a.headline
    fams = sorted({v.family for v in a.verdicts if v.family}, key=lambda f: not f.startswith("headline"))
    note = (f"ratio = arm / {a.arms[0].name} (the baseline): where the trials were interleaved and both trials of "
            "a round succeeded, the geometric mean of the per-round ratios (paired; the cell says so, and gives "
            "the ratio of the means where that reads otherwise), else the ratio of the means (Welch); the interval "
            "is at the "
            f"level each row was tested at ({pct} for one headline comparison at a fixed count); equivalent = two "
            f"one-sided tests within ±{100 * a.margin:g}%; the headline ({head.name if head else '-'}) carries the "
            f"verdict, the other metrics are tested with Holm's method once the headline shows a difference, "
            "else descriptive; each metric's direction and words are the workload's declaration. "
            + "families: " + "; ".join(fams)
            + ("" if a.meta.interleaved is not False else
               ". Not interleaved: drift between the two experiments cannot be told apart from the change"))
    agree = agreement_note(a)
    if agree:
        note += ". " + agree
    return Table("verdicts", f"Verdict: each arm against {a.arms[0].name}",
                 ["metric", "arm", f"{a.arms[0].name} mean", "arm mean", "ratio", "CI", "verdict", "tested as",
                  "trials to settle"], rows, note, right={2, 3, 4, 5}, whole={1})


def with_statistic(name: str, summaries) -> str:
    """'latency (mean)' where each trial's figure is the mean of its steps (a latency per request), so that a
    reader never takes it for a median or a p99; a rate (items over time) keeps its name."""
    return f"{name} (mean)" if summaries and all(s.mean_of_steps for s in summaries) else name


def arm_table(a: Analysis, units: Units | None = None) -> Table | None:
    rows, clipped = [], False
    units = units_of(a, units)
    for arm in a.arms:
        for m in a.metrics:
            s = arm.summaries.get(m.name) or TrialsSummary()
            n = s.n
            k, unit = units.of(m.name, m.unit)
            x = (lambda v: None if v is None else v * k)
            positive = n > 0 and (s.min or 0) >= 0
            clipped |= positive and n > 1 and s.ci_low is not None and s.ci_low < 0
            mean, low, high = fmt_all([x(s.mean), x(s.min), x(s.max)])
            name = with_statistic(m.name, arm.trial_summaries.get(m.name, [])) if m.source == "series" else m.name
            rows.append([arm.name, name, arm.device + (f" x{arm.num_gpus}" if arm.num_gpus > 1 else ""), arm.env,
                         f"{n}/{arm.n_total}", mean, interval(x(s.ci_low), x(s.ci_high), 1, positive) if n > 1 else "-",
                         span(low, high) if n else "-", f"{100 * (s.cv or 0):.2f}%" if n > 1 else "-",
                         unit])
    if not rows:
        return None
    return Table("arms", "Summary per arm (mean of per-trial figures)",
                 ["arm", "metric", "device", "env", "trials ok", "mean", f"{100 * a.confidence:g}% CI", "min–max",
                  "CV", "unit"], rows, CLIPPED_NOTE if clipped else "", right={4, 5, 6, 7, 8}, whole={0})


def per_trial_table(a: Analysis, units: Units | None = None) -> Table | None:
    head = a.headline
    if head is None:
        return None
    trials = sorted({t for arm in a.arms for t in arm.values.get(head.name, {})} |
                    {f.trial for f in a.failures})
    failed = {(f.arm, f.trial): f.status for f in a.failures}
    rows = []
    k, unit = units_of(a, units).of(head.name, head.unit)
    for t in trials:
        row = [f"{a.name} #{t + 1}"]
        values = [arm.values.get(head.name, {}).get(t) for arm in a.arms]
        for arm, value, text in zip(a.arms, values, fmt_all([None if v is None else v * k for v in values])):
            row.append(text if value is not None else failed.get((arm.name, t), "-"))
        rows.append(row)
    return Table("per_trial", f"Per trial: {head.name}" + (f" ({unit})" if unit else ""),  # no unit: no '()'
                 ["test case"] + [f"{arm.name} {unit}" if unit else arm.name for arm in a.arms], rows,
                 right=set(range(1, len(a.arms) + 1)))


def speedup_table(a: Analysis, units: Units | None = None) -> Table | None:
    if not a.speedup or a.headline is None:
        return None
    k, unit = units_of(a, units).of(a.headline.name, a.speedup[0].unit)
    x = (lambda v: None if v is None else v * k)
    rows = [[a.name, r.cpu_arm, fmt(x(r.cpu_mean)), r.gpu_arm, fmt(x(r.gpu_mean)), f"{r.speedup:.2f}×",
             interval(r.ci_low, r.ci_high, 2)] for r in a.speedup]
    return Table("speedup", "Speed-up: CPU time / GPU time for the same work",
                 ["test case", "CPU arm", f"CPU {unit}", "GPU arm", f"GPU {unit}", "speed-up",
                  f"{100 * a.confidence:g}% CI"], rows, right={2, 4, 5, 6})


def scaling_table(a: Analysis, units: Units | None = None) -> Table | None:
    if not a.scaling or a.headline is None:
        return None
    k, unit = units_of(a, units).of(a.headline.name, a.scaling[0].unit)
    rows = [[r.arm, str(r.num_gpus), fmt(r.mean * k), f"{r.speedup:.2f}×", f"{r.ideal:g}×",
             f"{100 * r.efficiency:.1f}%",
             "-" if r.eff_low is None else f"{100 * r.eff_low:.1f}%–{100 * r.eff_high:.1f}%"] for r in a.scaling]
    return Table("scaling", f"Scaling: N-GPU throughput / (N x {a.scaling[0].baseline})",
                 ["arm", "GPUs", unit, "speed-up", "ideal", "scaling efficiency", f"{100 * a.confidence:g}% CI"],
                 rows, right={1, 2, 3, 4, 5, 6})


def startup_table(a: Analysis) -> Table | None:
    keys = events.in_time_order(arm.startup for arm in a.arms)  # as the chart: in the order they happen
    if not keys:
        return None
    rows = [[arm.name] + [fmt(arm.startup[k], 3) if k in arm.startup else "-" for k in keys] for arm in a.arms]
    return Table("startup", "Start-up (seconds, mean over successful trials; never part of throughput)",
                 ["arm"] + [k.removesuffix("_s") for k in keys], rows, right=set(range(1, len(keys) + 1)))


def fingerprint_table(a: Analysis) -> Table | None:
    rows, marked = [], set()
    for i, (label, values, differs) in enumerate(fingerprint_rows(a.arms)):
        rows.append([label] + ["-" if v is None else str(v) for v in values] + ["≠" if differs else ""])
        if differs:
            marked.add(i)
    if not rows:
        return None
    return Table("fingerprints", "Where each arm ran (first successful trial)",
                 ["field"] + [arm.name for arm in a.arms] + ["differs"], rows, marked=marked)


def failure_table(a: Analysis) -> Table | None:
    if not a.failures:
        return None
    # the error's whole first line (a job's last lines are about 1 KB): a cut word would be misread
    rows = [[f.arm, str(f.trial + 1), f.status, clip(f.error.splitlines()[0], 1000) if f.error else "-"]
            for f in a.failures]
    return Table("failures", "Trials that did not finish", ["arm", "trial", "status", "error"], rows)


def time_shares_table(ts: TimeShares | None) -> Table | None:
    """Where the wall time went: each part in seconds, as a share of the wall time, and per trial."""
    if ts is None:
        return None
    rows = []
    for part in ts.parts():
        per = ts.per_trial.get(part)
        rows.append([LABELS[part], fmt(float(ts.seconds[part])), percent(ts.shares[part]),
                     "-" if per is None else fmt(float(per), 2)])
    rows.append(["wall time", fmt(float(ts.wall_s)), "100.0%",
                 fmt(float(ts.per_trial['wall']), 2) if "wall" in ts.per_trial else "-"])
    zyg = (f"; start-up holds {len(ts.zygote_starts_s)} zygote start(s) of "
           + ", ".join(f"{s:.1f}" for s in ts.zygote_starts_s) + " s") if ts.zygote_starts_s else ""
    note = (f"{ts.trials:,} trial(s); per trial: mean seconds from launch to exit (docs/trials.md defines each "
            f"part){zyg}{_warm_ups(ts.warm_ups)}{_warm_ups(ts.shape_warm_ups, 'shape(s)', 'blocks')}"
            f"{_ranks(ts.ranks)}")
    return Table("time", "Where the time went", ["part", "seconds", "share", "per trial (s)"], rows, note=note,
                 right={1, 2, 3})


def _ranks(ranks: dict | None) -> str:
    """The ranks' start inside start-up ('; across ranks in 3 trial(s), start-up 1.85 s per trial of which the
    ranks' start 0.22 s (processes 0.12, imports 0.01, process group 0.09); ranks forked 3')."""
    if not ranks:
        return ""
    per = ranks["per_trial"]
    how = ", ".join(f"{'forked' if k == 'fork' else 'spawned' if k == 'spawn' else k} {n}"
                    for k, n in ranks["started_by"].items())
    return (f"; across ranks in {ranks['trials']} trial(s), start-up {per['start_up_s']:.2f} s per trial of which "
            f"the ranks' start {per['ranks_s']:.2f} s (processes {per['ranks_process_s']:.2f}, imports "
            f"{per['ranks_import_s']:.2f}, process group {per['ranks_group_s']:.2f}); ranks {how}")


def _warm_ups(warm_ups: list[tuple[int, str]], what: str = "trial(s)", unit: str = "steps") -> str:
    """The adaptive warm-ups: their steps and why they stopped ('; warm-up until steady in 6 trial(s): 11 to 14
    steps (median 11); cap 1, steady 5'); per shape (gemm, membw) 'in 9 shape(s): 11 to 12 blocks ...'."""
    if not warm_ups:
        return ""
    steps = sorted(n for n, _ in warm_ups)
    mid = len(steps) // 2
    median = steps[mid] if len(steps) % 2 else (steps[mid - 1] + steps[mid]) / 2
    why = ", ".join(f"{stop} {sum(1 for _, s in warm_ups if s == stop)}" for stop in sorted({s for _, s in warm_ups}))
    span = f"{steps[0]}" if steps[0] == steps[-1] else f"{steps[0]} to {steps[-1]}"
    return f"; warm-up until steady in {len(warm_ups)} {what}: {span} {unit} (median {median:g}); {why}"


def _time_table(a: Analysis) -> Table | None:
    return time_shares_table(a.time)


def all_tables(a: Analysis, units: Units | None = None) -> list[Table]:
    """In reading order: the answer first, then the figures behind it, then where they came from; each metric
    in its one unit of this report (units_of)."""
    units = units_of(a, units)
    with_units = (verdict_table, speedup_table, scaling_table, arm_table, per_trial_table)
    made = [m(a, units) for m in with_units] + [m(a) for m in (startup_table, _time_table, failure_table,
                                                                 fingerprint_table)]
    return [t for t in made if t is not None]


def metric_name(v: MetricVerdict) -> str:
    """The headline as the workload's users name it: cnn-train's 'main' series is its images/sec."""
    return (v.unit or v.metric) if v.metric == "main" else v.metric


def _trials(v: MetricVerdict) -> str:
    return f"{v.n_a:,} trials each" if v.n_a == v.n_b else f"{v.n_b:,} and {v.n_a:,} trials"


def _pct(x: float) -> str:
    return fmt(100 * x, 1, 2)


def verdict_sentence(v: MetricVerdict, a: Analysis) -> str:
    """One arm's headline in one sentence a person can act on: 'container is 24.6% slower than host
    [20.2%–28.7%] on images/sec, 3 trials each'; 'no difference beyond ±2%'; 'can't tell yet: trial-to-trial
    noise is 65% (CV); about 720 trials per arm would settle ±2% — reduce the noise first'."""
    name, margin = metric_name(v), f"±{100 * v.margin:g}%"
    if v.ratio is None:
        return f"{v.arm} against {v.baseline} on {name}: no verdict — {v.reason or 'no figures'}"
    word = stats.direction(v.verdict)
    off = abs(v.ratio - 1)
    ends = sorted(abs(c - 1) for c in (v.ci_low, v.ci_high)) if v.ci_low is not None else None
    band = f" [{_pct(ends[0])}%–{_pct(ends[1])}%]" if ends else ""
    if v.verdict == "equivalent":
        return (f"{v.baseline} and {v.arm}: no difference beyond {margin} on {name} "
                f"({_pct(off)}% apart, {_trials(v)})")
    if stats.within_margin(v.verdict):
        return (f"{v.arm} is {_pct(off)}% {word} than {v.baseline}{band} on {name}, within the {margin} you "
                f"allow ({_trials(v)})")
    if v.verdict in v.words:
        return f"{v.arm} is {_pct(off)}% {word} than {v.baseline}{band} on {name}, {_trials(v)}"
    if v.verdict != "inconclusive":
        return f"{v.arm} against {v.baseline} on {name}: {v.verdict}"
    if v.reason.startswith("needs"):
        more = f" ({v.more_trials:,} more)" if v.more_trials else ""
        return (f"can't tell yet whether {v.arm} differs from {v.baseline} on {name}: 2 or more successful "
                f"trials per arm are needed{more}")
    cvs = [s.cv for arm in a.arms if arm.name in (v.arm, v.baseline)
           for s in [arm.summaries.get(v.metric)] if s is not None and s.cv is not None]
    noise = f"trial-to-trial noise is {_pct(max(cvs))}% (CV); " if cvs else ""
    if v.trials_needed is not None:
        settle = f"about {v.trials_needed:,} trials per arm would settle {margin}"
    else:
        settle = f"more than 10,000 trials per arm would be needed to settle {margin}"
    first = " — reduce the noise first" if cvs and (v.trials_needed is None or v.trials_needed > 50) else ""
    return (f"can't tell yet whether {v.arm} differs from {v.baseline} on {name} ({_pct(off)}% apart so far): "
            f"{noise}{settle}{first}")


def headline_sentence(a: Analysis) -> str:
    """The comparison's answer, led with in every format: one sentence per arm against the baseline
    (verdict_sentence), joined by '; '. An A/A run that differed says first that this is the setup's doing."""
    if a.aa_differed():
        measured = "; ".join(_aa_measured(v) if _differs(v) else verdict_sentence(v, a) for v in a.headline_verdicts())
        return f"{aa_sentence(a)} (measured: {measured})"
    return "; ".join(verdict_sentence(v, a) for v in a.headline_verdicts())


def value_text(value: Any) -> str:
    """A parameter's value as written, never as Python's repr: repr doubles every backslash (the regex (\\d+)
    would read (\\\\d+)). A list's strings are quoted as a shell would, so that spaces and commas stay readable."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(shlex.quote(v) if isinstance(v, str) else value_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {value_text(v)}" for k, v in value.items()) + "}"
    return str(value)


def _aa_measured(v: MetricVerdict) -> str:
    """An A/A arm's difference as a measurement, not a finding: 'b's ops/sec 18.2% above a's [5.1%–32.9%], 3
    trials each'."""
    ends = sorted(abs(c - 1) for c in (v.ci_low, v.ci_high)) if v.ci_low is not None else None
    band = f" [{_pct(ends[0])}%–{_pct(ends[1])}%]" if ends else ""
    side = "above" if v.ratio > 1 else "below"
    return f"{v.arm}'s {metric_name(v)} {_pct(abs(v.ratio - 1))}% {side} {v.baseline}'s{band}, {_trials(v)}"


AA_CELL = " (A/A: the setup's, not a finding)"


def _differs(v: MetricVerdict) -> bool:
    """The verdict shows a difference (outside the margin, or within it)."""
    return stats.within_margin(v.verdict) or v.verdict in v.words


def aa_sentence(a: Analysis) -> str:
    """What an A/A run that differed means, with the recorded disturbances that were seen (or that none was)."""
    text = "an A/A run differed: this setup is noisy or drifting; the figures below are not a finding"
    if not a.disturbances:
        return text + "; what competed with the trials was not recorded"
    seen = [s for d in a.disturbances for s in d.seen()]
    if seen:
        return text + "; disturbances recorded: " + "; ".join(seen)
    return text + ("; no disturbance was recorded (load, CPU pressure, steal, other GPU processes, GPU clocks): "
                   "look for drift or noise in the job itself")


def disturbance_lines(a: Analysis) -> list[tuple[str, str]]:
    """(level, text) per arm, beside the verdict: 'warning' where its trials were contended, else 'note'; the rule
    last where any arm was contended."""
    from gpuvs.probes import contention

    out = [line for d in a.disturbances for line in d.lines()]
    if a.contended:
        out.append(("note", contention.rule_text()))
    return out


def header_lines(a: Analysis) -> list[tuple[str, str]]:
    """(label, value) lines that say what was compared."""
    import time

    lines = [("experiment", f"{a.name} ({a.id})"), ("workload", a.workload),
             ("created", time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(a.created)) if a.created else "-")]
    meta = a.meta
    if meta.base is not None and meta.base.params:
        lines.append(("parameters", " ".join(f"{k}={value_text(v)}" for k, v in meta.base.params.items())))
    for arm in a.arms:
        lines.append((f"arm {arm.name}", " ".join(f"{k}={value_text(v)}" for k, v in arm.overrides.items())
                      or "(the base)"))
    if meta.command:
        lines.append(("command", meta.command))
    if meta.file:
        lines.append(("file", meta.file))
    if meta.seed is not None:
        lines.append(("trial order seed (--order-seed)", str(meta.seed)))
    return lines
