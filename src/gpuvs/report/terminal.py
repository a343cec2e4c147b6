"""The terminal: a tf_cnn_benchmarks-style step log while a trial runs, a line per trial, a summary per arm.

The summary is hyperfine-style.
Every text a job or its environment wrote goes through safetext.safe_text, and is printed with rich markup off."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from rich.console import Console
from gpuvs.report.fit import Table

from gpuvs import environments
from gpuvs.analysis import stats
from gpuvs.report import tables
from gpuvs.report.numbers import NO_SPREAD, Units, fmt, fmt_all, plain, plain_apart, spread
from gpuvs.safetext import safe_text
from gpuvs import events
from gpuvs.store.records import SeriesSummary
from gpuvs.store.summary import jitter, perf_timing, std_error
from gpuvs.trial.study import Look

CONFIG_LABELS = [
    ("model", "Model"), ("dataset", "Dataset"), ("mode", "Mode"), ("batch_size_global", "Batch size"),
    ("batch_size_per_device", ""), ("devices", "Num devices"), ("data_format", "Data format"),
    ("precision", "Precision"), ("optimizer", "Optimizer"), ("image_size", "Image size"),
    ("warmup_steps", "Warm-up steps"), ("steps", "Timed steps"),
]
RULE = "-" * 64
LABEL_WIDTH = 14  # tf_cnn_benchmarks' column; a label as long ('Warm-up steps:') still gets a space before its value


class StepLog:
    """Renders one trial's events as they arrive."""

    def __init__(self, console: Console, quiet: bool = False, show_config: bool = True):
        self.console = console
        self.quiet = quiet
        self.show_config = show_config
        self._steps: dict[str, tuple[list[float], list[float], list[float]]] = {}  # series -> items, seconds, values
        self._header_done: set[str] = set()
        self._last: dict[str, float] = {}  # series -> the rate its last line printed

    def start_trial(self) -> None:
        self._steps = {}
        self._header_done = set()
        self._last = {}

    def __call__(self, result, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "log":
            message = event["message"]
            self.console.print(safe_text(message, lines=True), style="yellow" if message.startswith("warning:") else
                               "dim", markup=False, highlight=False)
        if self.quiet:
            return
        if kind == "config" and self.show_config:
            self.config_block(event["items"])
            self.show_config = False
        elif kind == "sample":
            self.sample(event)

    def config_block(self, items: dict[str, Any]) -> None:
        shown = set()
        for key, label in CONFIG_LABELS:
            if key in items:
                suffix = " global" if key == "batch_size_global" else (" per device" if key == "batch_size_per_device" else "")
                self.console.print(safe_text(f"{(label + ':') if label else '':<{LABEL_WIDTH - 1}} {items[key]}{suffix}"),
                                   markup=False, highlight=False)
                shown.add(key)
        for key, value in items.items():
            if key not in shown:
                self.console.print(safe_text(f"{key.replace('_', ' ').capitalize() + ':':<{LABEL_WIDTH - 1}} {value}"),
                                   markup=False, highlight=False)
        self.console.print("=" * 10, highlight=False)

    def sample(self, event: dict[str, Any]) -> None:
        series = event.get("series", "main")
        items, seconds, values = self._steps.setdefault(series, ([], [], []))
        if event.get("value") is not None:
            values.append(event["value"])
            if event.get("seconds") and event.get("items") is not None:
                items.append(event["items"])
                seconds.append(event["seconds"])
        loss = (event.get("extra") or {}).get("loss")
        if loss is None and not (event.get("extra") or {}).get("display"):
            return
        if loss is None and not thinned(len(values)):  # a command's step figure: a line per step up to 100, then
            return  # one every 10, 100, ... steps, so that a long series costs the terminal little (its store keeps them)
        if series not in self._header_done:
            label = "" if series == "main" else f" [{series}]"
            unit = safe_text(event["unit"])
            self.console.print(f"Step\t{unit}{safe_text(label)}\ttotal_loss" if loss is not None
                               else f"Step\t{unit}{safe_text(label)}", markup=False, highlight=False)
            self._header_done.add(series)
        if seconds and len(seconds) == len(values):  # timed steps: tf_cnn_benchmarks' get_perf_timing
            rate, pm, jit = perf_timing(items, seconds)
        else:  # a figure per step that is not items over time (a latency): its mean
            rate, pm, jit = sum(values) / len(values), std_error(values), jitter(values)
        line = f"{event['step']}\t{safe_text(event['unit'])}: {self.figures(series, rate, pm, jit, len(values))}"
        if loss is not None:
            line += f"\t{loss:.3f}"
        self.console.print(line, markup=False, highlight=False)

    def figures(self, series: str, rate: float, pm: float, jit: float, n: int) -> str:
        """'0.104 +/- 0.0021 (jitter = 0.0030)': the rate with the significant figures that tell it from the line
        before (at least 3), the spread with the rate's decimals and at least 2 significant figures; a single
        step has no spread (numbers.NO_SPREAD)."""
        text = plain_apart(rate, self._last.get(series))
        self._last[series] = rate
        places = len(text.partition(".")[2])
        pm_text, jit_text = ((NO_SPREAD, NO_SPREAD) if n < 2 else
                             (plain(pm, places, 2), plain(jit, places, 2)))
        return f"{text} +/- {pm_text} (jitter = {jit_text})"


def thinned(n: int) -> bool:
    """Whether the n-th step of a command's step figure gets a line: every one up to 100, then one in 10 up to
    1,000, one in 100 up to 10,000, and so on."""
    return n <= 100 or n % 10 ** (len(str(n)) - 2) == 0


def trial_line(result, units: Units | None = None) -> str:
    """One line per trial (more where its error has more), control characters escaped; `units`: the report's
    units so far (the first trial's figure chooses its metric's, and the tables after keep it)."""
    return safe_text(_trial_line(result, units if units is not None else Units()), lines=True)


def _trial_line(result, units: Units) -> str:
    spec = result.spec
    where = f"{environments.label(spec.env)}, {spec.device}" + (f" x{spec.num_gpus}" if spec.num_gpus > 1 else "")
    head = f"trial {spec.trial + 1} [{spec.arm}] ({where})"
    if not result.ok:
        return f"{head}: {result.status.upper()}: {result.error}"
    main = result.primary() or SeriesSummary()
    k, unit = units.of(next(iter(result.summary), ""), main.unit, [main.value])
    value = fmt(None if main.value is None else main.value * k)
    n = None if main.figure == "last printed" else main.n  # a job's own +/- over steps gpuvs did not see
    pm, jitter = (spread(None if x is None else x * k, n) for x in (main.pm, main.jitter))
    text = f"{head}: {value} {unit} +/- {pm} (jitter = {jitter})"
    start = result.startup
    parts = [f"{k.removesuffix('_s').replace('_', ' ')} {v:.2f} s" for k, v in start.items()
             if k in ("first_step_s", "launch_to_timed_s")]
    if parts:
        text += "; start-up: " + ", ".join(parts)
    return text


def total_block(console: Console, result) -> None:
    """tf_cnn_benchmarks' closing 'total images/sec: N' line, for the workload's headline series (named
    when it is not the only one); small figures keep three significant digits instead of printing 0.00."""
    main = result.primary()
    if result.ok and main:
        series = next(iter(result.summary))
        named = f" ({series})" if len(result.summary) > 1 else ""
        value = main.value or 0.0
        text = f"{value:.2f}" if abs(value) >= 1 else f"{value:.3g}"
        console.print(RULE, highlight=False)
        console.print(safe_text(f"total {main.unit}{named}: {text}"), markup=False, highlight=False)
        console.print(RULE, highlight=False)


def safe_cells(*cells: object) -> list[str]:
    """Table cells with control characters escaped: names, units and errors may come from a job."""
    return [safe_text(c) for c in cells]


def _in_order(arms: Sequence[str]):
    """A sort key: the experiment's arms in their declared order (the baseline first), whatever order the
    trials ran in; an arm not declared after them."""
    return lambda arm: arms.index(arm) if arm in arms else len(arms)


def results_units(results: Iterable, units: Units | None = None) -> Units:
    """The one unit of each series and metric of these trials, chosen from all their figures (numbers.Units);
    `units`: the choices already made for this report, which stay."""
    units = units if units is not None else Units()
    figures: dict[str, tuple[str, list[float | None]]] = {}
    for r in results:
        if r.ok:
            for name, m in [*r.summary.items(), *r.metrics.items()]:
                figures.setdefault(name, (m.unit, []))[1].append(m.value)
    for name, (unit, values) in figures.items():
        units.of(name, unit, values)
    return units


def arm_table(results: Iterable, title: str = "Summary across trials", arms: Sequence[str] = (),
              units: Units | None = None) -> Table:
    """One row per arm and series: mean of per-trial figures, 95% CI, range, CV; arms in `arms`' order
    (the baseline first), not the order the first trials happened to run in; each series in its one unit."""
    groups: dict[tuple[str, str], list] = {}
    results = sorted(results, key=lambda r: _in_order(list(arms))(r.spec.arm))
    units = results_units(results, units)
    for r in results:
        for series in (r.summary or {"main": None}):
            groups.setdefault((r.spec.arm, series), []).append(r)
    table = Table(title=title, title_justify="left")
    for col in ("arm", "series", "trials ok", "mean", "95% CI", "min–max", "CV", "unit"):
        table.add_column(col, justify="right" if col not in ("arm", "series", "unit") else "left")
    for (arm, series), rs in groups.items():
        ok = [r for r in rs if r.ok and series in r.summary]
        values = [r.summary[series].value for r in ok]
        s = stats.summarize_trials(values)
        k, unit = units.of(series, ok[0].summary[series].unit if ok else "")
        x = (lambda v: None if v is None else v * k)
        ci = tables.interval(x(s.ci_low), x(s.ci_high), 1, positive=(s.min or 0) >= 0) if s.n > 1 else "-"
        mean, low, high = fmt_all([x(s.mean), x(s.min), x(s.max)])
        label = tables.with_statistic(series, [r.summary[series] for r in ok])
        table.add_row(*safe_cells(arm, label), f"{len(ok)}/{len(rs)}", mean, ci, tables.span(low, high) if ok else "-",
                      f"{100 * (s.cv or 0):.2f}%" if s.n > 1 else "-", safe_text(unit))
    return table


def startup_table(results: Iterable, arms: Sequence[str] = ()) -> Table | None:
    """Start-up costs per arm (mean over ok trials), kept apart from throughput; arms in `arms`' order."""
    groups: dict[str, dict[str, list[float]]] = {}
    for r in sorted(results, key=lambda r: _in_order(list(arms))(r.spec.arm)):
        if r.ok:
            for k, v in events.milestones(r.startup).items():
                groups.setdefault(r.spec.arm, {}).setdefault(k, []).append(v)
    if not groups:
        return None
    keys = events.in_time_order({k: sum(v) / len(v) for k, v in d.items()} for d in groups.values())
    table = Table(title="Start-up (seconds, mean over trials)", title_justify="left")
    table.add_column("arm")
    for k in keys:
        table.add_column(safe_text(k.removesuffix("_s")), justify="right")
    for arm, d in groups.items():
        table.add_row(safe_text(arm), *[fmt(sum(d[k]) / len(d[k]), 3) if k in d else "-" for k in keys])
    return table


def metrics_table(results: Iterable, units: Units | None = None) -> Table | None:
    results = list(results)
    units = results_units(results, units)
    rows = [(r.spec.arm, r.spec.trial + 1, name, m.value * units.of(name, m.unit)[0] if m.value is not None else None,
             units.of(name, m.unit)[1]) for r in results if r.ok
            for name, m in r.metrics.items() if "/" not in name]  # SERIES/NAME metrics: series_table
    if not rows:
        return None
    table = Table(title="Other results", title_justify="left")
    for col in ("arm", "trial", "metric", "value", "unit"):
        table.add_column(col, justify="right" if col in ("trial", "value") else "left")
    for arm, trial, name, value, unit in rows:
        table.add_row(*safe_cells(arm, str(trial), name, fmt(value, 3), unit))
    return table


def series_table(results: Iterable, units: Units | None = None) -> Table | None:
    """Per arm and series: the headline figure and the per-series metrics a workload reports as
    'SERIES/NAME' (GEMM microseconds and % of peak, kernel wall time and footprint...), means over ok trials;
    the series' figure in its one unit (each SERIES/NAME column is in the unit its name and workload say)."""
    results = list(results)
    units = results_units(results, units)
    rows: dict[tuple[str, str], dict[str, list[float]]] = {}
    units_of_series: dict[tuple[str, str], str] = {}
    columns: list[str] = []
    for r in results:
        if not r.ok:
            continue
        for name, m in r.metrics.items():
            series, sep, key = name.rpartition("/")
            if not sep or series not in r.summary or m.value is None:
                continue
            row = rows.setdefault((r.spec.arm, series), {})
            row.setdefault(key, []).append(m.value)
            units_of_series[(r.spec.arm, series)] = r.summary[series].unit
            row.setdefault("", []).append(r.summary[series].value)
            if key not in columns:
                columns.append(key)
    if not rows:
        return None
    table = Table(title="Per series (mean over trials)", title_justify="left")
    for col in ("arm", "series", "value", "unit"):
        table.add_column(col, justify="right" if col == "value" else "left")
    for key in columns:
        table.add_column(safe_text(key.replace("pct_", "% ").replace("_", " ")), justify="right")
    for (arm, series), row in rows.items():
        head = [v for v in row.get("", []) if v is not None]
        cells = [fmt(sum(row[k]) / len(row[k]), 1) if row.get(k) else "-" for k in columns]
        k, unit = units.of(series, units_of_series[(arm, series)])
        table.add_row(*safe_cells(arm, series, fmt(k * sum(head) / len(head), 2) if head else "-", unit), *cells)
    return table


def telemetry_table(results: Iterable) -> Table | None:
    """NVML readings per arm and GPU over its trials: utilisation, memory, power, clocks, temperature,
    and every throttle reason seen with the share of readings that showed it."""
    from gpuvs.probes import telemetry

    groups: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        if r.telemetry:
            groups.setdefault(r.spec.arm, []).extend(t.to_dict() for t in r.telemetry)
    if not groups:
        return None
    table = Table(title="GPU telemetry (NVML)", title_justify="left")
    for col in ("arm", "gpu", "readings", "util % mean/max", "memory MiB max", "power W mean/max",
                "SM MHz mean (min)", "temp °C max", "throttling"):
        table.add_column(col, justify="left" if col in ("arm", "throttling") else "right")
    def num(s: dict[str, Any], key: str, digits: int = 0) -> str:
        return fmt(float(s[key]), digits) if s.get(key) is not None else "-"

    for arm, readings in groups.items():
        for gpu, s in telemetry.summarize_by_gpu(readings).items():
            throttled = ", ".join(f"{name} {100 * frac:.0f}%" for name, frac in s["throttle_fraction"].items())
            table.add_row(safe_text(arm), str(gpu), str(s["n"]), f"{num(s, 'util_gpu_mean', 1)} / {num(s, 'util_gpu_max')}",
                          num(s, "mem_used_mib_max"), f"{num(s, 'power_w_mean', 1)} / {num(s, 'power_w_max', 1)}",
                          f"{num(s, 'sm_clock_mhz_mean')} ({num(s, 'sm_clock_mhz_min')})", num(s, "temp_c_max"),
                          throttled or "none")
    return table


def rich_table(t, no_wrap: Iterable[int] = (), fold: bool = False) -> Table:
    """A report table (report/tables.py) as a rich table; highlighted rows in yellow. `no_wrap`: columns never
    cut (ids people copy); `fold`: a long word in the others wraps instead of ending in an ellipsis."""
    table = Table(title=safe_text(t.title), title_justify="left", caption=safe_text(t.note) if t.note else None,
                  caption_justify="left")
    keep = set(no_wrap) | set(getattr(t, "whole", ()))
    for i, col in enumerate(t.columns):
        table.add_column(safe_text(col), justify="right" if i in t.right else "left", no_wrap=i in keep,
                         overflow="fold" if fold else "ellipsis")
    for i, row in enumerate(t.rows):
        table.add_row(*safe_cells(*row), style="yellow" if i in t.marked else None)
    return table


def comparison(console: Console, analysis, keys: tuple[str, ...] | None = None, units: Units | None = None) -> None:
    """A comparison's report on the terminal: the answer first, what was compared, its tables (all, or
    `keys`), flags; `units`: the units its trial lines and tables already chose (a live run), which stay."""
    answer = tables.headline_sentence(analysis)
    if answer:
        console.print(safe_text(answer), style="bold", highlight=False, markup=False, emoji=False)
    beside = analysis.programs.said() if analysis.programs else []
    for level, text in beside:  # what the arms ran, beside the verdict (analysis/programs.py)
        console.print(f"{level}: {safe_text(text)}", style="yellow", highlight=False, markup=False, emoji=False)
    for level, text in tables.disturbance_lines(analysis):  # what competed with each arm's trials
        console.print(f"warning: {safe_text(text)}" if level == "warning" else safe_text(text),
                      style="yellow" if level == "warning" else "dim", highlight=False, markup=False, emoji=False)
    if keys is None:
        for label, value in tables.header_lines(analysis):
            pad = max(18, len(label) + 2)  # a label longer than the column still gets its space
            console.print(safe_text(f"{label + ':':<{pad}}{value}"), highlight=False, markup=False, emoji=False)
    for t in tables.all_tables(analysis, units):
        if keys is None or t.key in keys:
            console.print(rich_table(t))
    for flag in analysis.flags:
        if flag not in {text for _, text in beside}:
            console.print(f"warning: {safe_text(flag)}", style="yellow", highlight=False, markup=False)


def heading(console: Console, text: str) -> None:
    """A section's heading: a rule with the text in it where it fits the page, else the whole text (wrapped)
    over a plain rule; never a title cut short. What a job named (an arm, a workload) is shown escaped."""
    text = safe_text(text)
    if len(text) + 8 <= console.width:
        console.rule(text, style="dim")
    else:
        console.print(text, style="dim", highlight=False, markup=False, emoji=False)
        console.rule(style="dim")


def look_line(look: Look) -> tuple[str, str]:
    """One look of compare's stopping rule (trial.study.Look) as (line, style)."""
    if look.decision == "empty":
        return f"until-confident: stopping; arm {look.arm} has no successful trial", "yellow"
    if look.decision == "settled":
        return f"until-confident: settled after {look.per_arm:,} trials per arm", "green"
    if look.decision == "capped":
        return (f"until-confident: not settled after {look.per_arm:,} trials per arm (--max-trials "
                f"{look.max_trials})", "yellow")
    return f"until-confident: not settled after {look.per_arm:,} trials per arm; adding {look.add:,} per arm", "dim"


class TrialProgress:
    """A rich progress bar over an experiment's trials: trial i of n, the arm, elapsed time and the time left.
    The time left is the trials left times the mean time of a finished trial (less what the one running has
    taken), so it counts every trial left, not the rate of the last few seconds. The total may grow
    (--until-confident adds trials up to `up_to`): the count says 'up to N' and the time left is a range
    from the trials planned now to N. Hidden until the first trial starts (no count before there is one)."""

    def __init__(self, console: Console, up_to: int | None = None):
        import time

        from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
        from rich.text import Text

        self.up_to, self._clock = up_to, time.monotonic
        self._started: float | None = None
        self._finished: list[float] = []  # when each trial ended
        bar = self

        class Count(ProgressColumn):
            def render(self, task) -> Text:
                return Text(bar.count_text(int(task.completed), task.total))

        class Left(ProgressColumn):
            def render(self, task) -> Text:
                return Text(bar.left_text(int(task.completed), task.total), style="progress.remaining")

        self.progress = Progress(TextColumn("{task.description}", markup=False), BarColumn(), Count(),
                                 TimeElapsedColumn(), Left(), console=console, transient=False)
        self.task = self.progress.add_task("trials", total=None, visible=False)

    def __enter__(self) -> TrialProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def start(self, spec, i: int, n: int) -> None:
        if self._started is None:
            self._started = self._clock()
        self.progress.update(self.task, total=n, completed=i, visible=True,
                             description=safe_text(f"trial {i + 1} of {n}: arm {spec.arm}"))

    def done(self) -> None:
        self._finished.append(self._clock())
        self.progress.advance(self.task)

    def count_text(self, done: int, total: float | None) -> str:
        """'3/6', or '3/6 (up to 40)' while --until-confident may add trials."""
        if total is None:
            return f"{done}"
        more = f" (up to {self.up_to})" if self.up_to and self.up_to > total else ""
        return f"{done}/{int(total)}{more}"

    def left_text(self, done: int, total: float | None) -> str:
        """'ETA 0:42' from the mean finished trial over the trials left; 'ETA 0:42 to 4:40' where up to N may run;
        'ETA -' before a trial has finished."""
        if total is None or self._started is None or not self._finished:
            return "ETA -"
        now = self._clock()
        per_trial = (self._finished[-1] - self._started) / len(self._finished)
        running = now - self._finished[-1] if done < total else 0.0

        def left(count: float) -> str:
            return _clock_text(max(0.0, per_trial * max(0.0, count - done) - running))

        if self.up_to and self.up_to > total:
            return f"ETA {left(total)} to {left(self.up_to)}"
        return f"ETA {left(total)}"


def _clock_text(seconds: float) -> str:
    """0:42, 1:02:03: a duration as a clock reads it."""
    s = int(round(seconds))
    h, m = divmod(s // 60, 60)
    return f"{h}:{m:02d}:{s % 60:02d}" if h else f"{m}:{s % 60:02d}"
