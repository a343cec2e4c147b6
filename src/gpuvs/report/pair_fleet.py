"""A pair fleet run's report (`gpuvs fleet --pairs`, `gpuvs report ID`), its summary sentence first.

Then a row per node and a row per pair, each stacked onto a second line where it would pass the width (80).
Long text is wrapped at words; every text is escaped (safetext.py) before it is measured.
JSON is the result's to_dict(); markdown the same rows as tables."""

from __future__ import annotations

import html as html_lib
import json
import textwrap

from gpuvs.fleet.execute.pair_run import PairFleetResult
from gpuvs.fleet.assess.pair_verdicts import UnitVerdict
from gpuvs.safetext import safe_text

FORMATS = ("term", "md", "html", "json")


def _speed(v: UnitVerdict) -> str:
    if v.speed is None:
        return "-"
    if v.ci_low is None:
        return f"{v.speed:.3f}x"
    return f"{v.speed:.3f}x [{v.ci_low:.3f}-{v.ci_high:.3f}]"


def _wrap(line: str, width: int, indent: str = "") -> list[str]:
    """The line, escaped, wrapped at words to the width (a word is never cut: a node's name stays whole, hyphens
    included); continuation lines indented as the line is, plus `indent`."""
    line = safe_text(line)
    if len(line) <= width:
        return [line]
    lead = line[:len(line) - len(line.lstrip(" "))]
    return textwrap.wrap(line, width, initial_indent="", subsequent_indent=lead + indent, break_long_words=False,
                         break_on_hyphens=False) or [line]


def _fit(head: str, tail: str, width: int) -> list[str]:
    """One row, or, where it would pass the width, the tail stacked under the head, indented, each wrapped."""
    line = f"{head}  {tail}" if tail else head
    if len(safe_text(line)) <= width or not tail:
        return _wrap(line, width, "    ")
    return _wrap(head, width, "    ") + _wrap("    " + tail, width, "  ")


def node_rows(res: PairFleetResult) -> list[tuple[str, str, str, str]]:
    return [(v.node, v.verdict, _speed(v), f"{len(v.partners)} pairs: {', '.join(v.partners)}"
             + (f" ({v.reason})" if v.reason else "")) for v in res.outcome.nodes]


def pair_rows(res: PairFleetResult) -> list[tuple[str, str, str, str]]:
    out = []
    for v in res.outcome.pairs:
        mean = "-" if v.mean is None else f"{v.mean:.4g} {res.unit}"
        notes = [f"{v.n} trials, mean {mean}"] + ([f"cause: {v.cause}"] if v.cause else []) + (
            [v.reason] if v.reason else [])
        out.append((f"{v.pair[0]} + {v.pair[1]}", v.verdict, _speed(v), "; ".join(notes)))
    out += [(arm.replace("+", " + "), "failed", "-", why) for arm, why in sorted(res.failed.items())]
    return out


def text(res: PairFleetResult, width: int = 80) -> str:
    lines: list[str | list[str]] = [res.outcome.summary(), ""]
    lines.append(f"pair fleet of {len(res.nodes)} nodes: {res.workload}, {res.trials} trials per pair, "
                 f"{len(res.first)} pairs first, {len(res.second_pairs)} second; {res.pod_starts} pod starts, "
                 f"{res.seconds:.0f} s")
    if res.suspects:
        lines.append(f"suspects after the first pass: {', '.join(res.suspects)}")
    for title, rows in (("nodes (speed of its links against the fleet's)", node_rows(res)),
                        ("pairs (speed against the fleet's)", pair_rows(res))):
        lines += ["", title]
        w = max(len(r[0]) for r in rows) if rows else 0
        for name, verdict, speed, notes in rows:
            lines.append(_fit(f"  {name:<{w}}  {verdict:<20}  {speed}", notes, width))
    c = res.outcome.control
    lines += ["", f"{c.confidence:.0%} confidence for the whole run: {c.method}, {c.looks} looks; "
                  f"margin ±{res.margin:.0%}"]
    for lab in res.labels:
        lines.append(f"label {lab['node']}: {lab['labels']} ({lab['status']})")
    for e in res.excluded:
        lines.append(f"node {e['node']}: left out, {e['reason']}")
    out: list[str] = []
    for x in lines:
        out += x if isinstance(x, list) else _wrap(x, width, "  ")
    return "\n".join(out) + "\n"


def markdown(res: PairFleetResult) -> str:
    out = [f"**{res.outcome.summary()}**", ""]
    for title, rows in (("node", node_rows(res)), ("pair", pair_rows(res))):
        out += [f"| {title} | verdict | speed vs fleet [interval] | notes |", "| --- | --- | --- | --- |"]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows] + [""]
    return "\n".join(safe_text(x) for x in out)


def render(fmt: str, res: PairFleetResult, width: int = 80) -> str:
    if fmt == "json":
        return json.dumps(res.to_dict(), indent=2) + "\n"
    if fmt == "md":
        return markdown(res)
    if fmt == "html":
        return f"<!doctype html><meta charset=utf-8><pre>{html_lib.escape(text(res, 120))}</pre>\n"
    return text(res, width)
