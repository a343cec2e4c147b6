"""How a number is written in every report, in one place, so that the same figure reads the same everywhere.

By significant figures, never rounded to nothing (0.192, not 0.2), whole numbers with thousands separators.
Figures side by side get the digits that tell them apart (fmt_all); choose_unit picks one unit per metric per report."""

from __future__ import annotations

import math
import re
from typing import Any, Sequence

SIGNIFICANT = 3
NO_SPREAD = "n/a"  # the one spelling of "no spread measured" (a single figure has no +/- and no jitter)
TIME_UNITS = {"s": ("ms", "µs"), "sec": ("ms", "µs"), "seconds": ("ms", "µs"), "ms": ("µs", "ns")}
# Units of one kind, in a common base: a figure in one is written in another by the ratio of the two.
KINDS = ({"s": 1.0, "sec": 1.0, "seconds": 1.0, "ms": 1e-3, "µs": 1e-6, "us": 1e-6, "ns": 1e-9},
         {"B": 1.0, "bytes": 1.0, "KiB": 2.0 ** 10, "MiB": 2.0 ** 20, "GiB": 2.0 ** 30})
# The unit a metric's name ends in ('latency_p95_ms'); '_per_sec' names a rate, not a time.
NAME_UNITS = {"s": "s", "sec": "s", "seconds": "s", "ms": "ms", "us": "µs", "ns": "ns", "bytes": "bytes",
              "kib": "KiB", "mib": "MiB", "gib": "GiB"}
_NAME_UNIT = re.compile(r"(?<!per)_(" + "|".join(NAME_UNITS) + r")$", re.IGNORECASE)


def _decimals(value: float, digits: int, significant: int = SIGNIFICANT) -> int:
    """Decimals that show `value` with at least `digits` decimals and `significant` significant figures."""
    if value == 0 or abs(value) >= 10 ** (significant - 1):
        return digits if abs(value) < 1e5 else 0
    return max(digits, significant - 1 - math.floor(math.log10(abs(value))))


def fmt(value: Any, digits: int = 1, significant: int = SIGNIFICANT) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != value:  # nan
            return "-"
        if math.isinf(value):
            return "∞" if value > 0 else "-∞"
        if value != 0 and abs(value) < 1e-4:
            return f"{value:.{significant}g}"
        return f"{value:,.{_decimals(value, digits, significant)}f}"
    return str(value)


def fmt_all(values: Sequence[float | None], digits: int = 1) -> list[str]:
    """The figures of one row or column, each with the significant figures that tell the different ones apart
    (0.1923 and 0.1925, not 0.192 and 0.192); at most 3 more than fmt gives."""
    real = [v for v in values if isinstance(v, float) and v == v and not math.isinf(v)]
    for extra in range(4):
        out = [fmt(v, digits, SIGNIFICANT + extra) for v in values]
        shown = {}
        for v, text in zip(values, out):
            if v in real:
                shown.setdefault(text, set()).add(v)
        if all(len(vs) == 1 for vs in shown.values()):
            return out
    return out


def scale_unit(values: Sequence[float | None], unit: str) -> tuple[float, str]:
    """(factor, unit) that writes these figures of a time unit without leading zeros: seconds below one as
    ms, below a thousandth as µs. Any other unit as it is (factor 1)."""
    smaller = TIME_UNITS.get(unit)
    real = [abs(v) for v in values if isinstance(v, (int, float)) and v == v and v != 0 and not math.isinf(v)]
    if not smaller or not real or max(real) >= 1:
        return 1.0, unit
    if max(real) >= 1e-3:
        return 1e3, smaller[0]
    return 1e6, smaller[1]


def name_unit(name: str) -> str | None:
    """The unit a metric's name ends in: 'wall_time_s' -> 's', 'gemm/latency_us' -> 'µs'; None for
    'events_per_sec' (a rate) or a name without one."""
    m = _NAME_UNIT.search(name.rpartition("/")[2])
    return NAME_UNITS[m.group(1).lower()] if m else None


def _kind(unit: str) -> dict[str, float] | None:
    return next((k for k in KINDS if unit in k), None)


def choose_unit(name: str, unit: str | None, values: Sequence[float | None]) -> tuple[float, str]:
    """(factor, unit) for every figure of one metric in one report, given all of them: the one place a
    unit is chosen. A name that ends in a unit of the declared unit's kind is shown in it, never scaled
    ('wall_time_s' stays in s, so no name sits beside a unit that contradicts it); else seconds
    below one as ms or µs (scale_unit)."""
    unit = unit or ""
    own = name_unit(name)
    kind = _kind(unit)
    if own is not None and kind is not None and own in kind:
        return (1.0, unit) if kind[unit] == kind[own] else (kind[unit] / kind[own], own)  # 'us' stays 'us'
    return scale_unit(values, unit)


class Units:
    """One unit per metric in one report: chosen once (choose_unit, from the figures known then) and
    kept for every table, chart and line after, whatever figures they show."""

    def __init__(self) -> None:
        self.chosen: dict[tuple[str, str], tuple[float, str]] = {}  # (name, declared unit): two workloads' 'main'

    def of(self, name: str, unit: str | None, values: Sequence[float | None] = ()) -> tuple[float, str]:
        key = (name, unit or "")
        if key not in self.chosen:
            self.chosen[key] = choose_unit(name, unit, values)
        return self.chosen[key]

    def scaled(self, name: str, unit: str | None, values: Sequence[float | None]) -> tuple[list[float | None], str]:
        """The figures of one metric in its report's unit, and that unit."""
        k, shown = self.of(name, unit, values)
        return [None if v is None else v * k for v in values], shown


def fmt_unit(value: float | None, unit: str) -> str:
    """'235 ms', '1,204.5 images/sec': the figure with its unit, scaled (scale_unit)."""
    if value is None or value != value:
        return "-"
    factor, shown = scale_unit([value], unit)
    return f"{fmt(value * factor)} {shown}".rstrip()


def percent(fraction: float, digits: int = 1) -> str:
    """A fraction as a percentage with at least two significant figures: 0.0004 -> '0.040%', not '0.0%'."""
    return f"{fmt(100 * fraction, digits, 2)}%"


def spread(value: float | None, n: int | None, digits: int = 1, significant: int = SIGNIFICANT) -> str:
    """A +/- or a jitter: NO_SPREAD where fewer than two figures were measured (or none was given), never
    '0.0' or '-'."""
    if value is None or value != value or (n is not None and n < 2):
        return NO_SPREAD
    return fmt(value, digits, significant)


def plain(value: float, digits: int = 1, significant: int = SIGNIFICANT) -> str:
    """A figure in a log line, as tf_cnn_benchmarks writes one (no thousands separators, for the tools that
    read such lines) with at least `digits` decimals and `significant` significant figures: 0.104, not 0.1."""
    if value != value or math.isinf(value):
        return str(value)
    return f"{value:.{_decimals(value, digits, significant)}f}"


def plain_apart(value: float, before: float | None, digits: int = 1) -> str:
    """plain(value) with the significant figures (3 to 6) that tell it from the figure printed before it."""
    for extra in range(4):
        text = plain(value, digits, SIGNIFICANT + extra)
        if before is None or before == value or text != plain(before, digits, SIGNIFICANT + extra):
            return text
    return text
