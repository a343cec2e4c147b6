"""How a number is written in every report (terminal, markdown, HTML, charts, the command line's tables):
one place, so that the same figure reads the same everywhere."""

from __future__ import annotations

from typing import Any


def fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != value:  # nan
            return "-"
        if abs(value) >= 1e5 or (0 < abs(value) < 10 ** -digits):
            return f"{value:.3g}"
        return f"{value:,.{digits}f}"
    return str(value)
