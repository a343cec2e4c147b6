"""The markdown report: GitHub tables, the ones people paste into wikis, posts and tickets. Text from users, jobs
and their environments is shown with control characters escaped (safetext.py)."""

from __future__ import annotations

import re

from gpuvs.analysis.comparison import Analysis
from gpuvs.report import tables
from gpuvs.safetext import safe_text


def cell(text: str) -> str:
    """A table cell: one line, pipes escaped, angle brackets as entities (names come from users)."""
    return safe_text(" ".join(str(text).split())).replace("\\", "\\\\").replace("|", "\\|").replace(
        "<", "&lt;").replace(">", "&gt;")


def code_span(text: str) -> str:
    """`text` as one CommonMark code span that reads back as exactly `text` (control characters escaped, so one
    line): fenced by a run of backticks longer than any run inside, padded with a space where the text starts or
    ends with a backtick, or with a space at both ends (a parser strips one space from each side of such text).
    CommonMark has no empty code span: an empty text is a span of one space."""
    text = safe_text(text)
    if not text:
        return "` `"
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text[0] == "`" or text[-1] == "`" or (text[0] == " " and text[-1] == " " and text.strip(" ")) else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def table(t: tables.Table) -> str:
    lines = [f"### {cell(t.title)}", "", "| " + " | ".join(cell(c) for c in t.columns) + " |",
             "| " + " | ".join("---:" if i in t.right else "---" for i in range(len(t.columns))) + " |"]
    for i, row in enumerate(t.rows):
        cells = [cell(c) for c in row]
        if i in t.marked:
            cells[0] = f"**{cells[0]}**"
        lines.append("| " + " | ".join(cells) + " |")
    if t.note:
        lines += ["", f"_{cell(t.note)}_"]
    return "\n".join(lines)


def render(a: Analysis) -> str:
    out = [f"## {cell(a.name)}", ""]
    answer = tables.headline_sentence(a)
    if answer:
        out += [f"**{cell(answer)}**", ""]
    out += [f"- {label}: {code_span(value)}" if label in ("command", "file") else f"- {cell(label)}: {cell(value)}"
            for label, value in tables.header_lines(a)]
    busy = tables.disturbance_lines(a)
    if busy:  # after the experiment's list, with a paragraph between: two lists in a row would read as one
        out += ["", "**What competed with the trials:**", ""] + [
            f"- ⚠ warning: {cell(text)}" if level == "warning" else f"- {cell(text)}" for level, text in busy]
    if a.flags:
        out += ["", "**Differences nobody asked for:**", ""] + [f"- ⚠ {cell(f)}" for f in a.flags]
    for t in tables.all_tables(a):
        out += ["", table(t)]
    return "\n".join(out) + "\n"
