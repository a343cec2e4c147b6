"""Sharing's figures as text, for the tables of gpuvs share and advise-mps: a figure over repeated
groups as 'mean [low, high]', a ratio of two arms with its interval and verdict."""

from __future__ import annotations

from gpuvs.report.numbers import fmt
from gpuvs.sharing.stats import Figure, MpsVerdict
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
