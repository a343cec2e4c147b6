"""Every table gpuvs prints on a terminal, a pipe or a CI log: never cut, and no number, interval or word broken.

A column is never narrower than its longest unbreakable piece, and a cell wraps only at the spaces between pieces.
A table wider than the page at its narrowest is stacked, as 'column: value' lines per row.
Where two or three tables fit, its columns are spread over them instead, each with the columns that name a row."""

from __future__ import annotations

import re
from typing import Iterable, List

from rich import table as rich_table
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.padding import Padding
from rich.text import Text

# An interval written with spaces is one atom, kept on one line: '-1.2 to 3.4', '[3,920, 4,100]', '50.0 / 100'.
_NUM = r"[-+]?\d[^\s\[\],]*(?:,\d[^\s\[\],]*)*"
_JOINED = re.compile(rf"\[{_NUM}, {_NUM}\]|{_NUM} to {_NUM}(?!\S)|{_NUM} / {_NUM}(?!\S)")
_GLUE = "\ue000"  # stands for a space inside an atom while rich wraps a line (one cell wide, not a space)


def atoms(text: str) -> list[str]:
    """The pieces of `text` a line may not break: its whitespace-separated words, an interval written with
    spaces ('-1.2 to 3.4', '[3,920, 4,100]') taken whole."""
    return [a.replace(_GLUE, " ") for a in _glued(text).split()]


def _glued(text: str) -> str:
    return _JOINED.sub(lambda m: m.group(0).replace(" ", _GLUE), text) if " " in text else text


def widest_atom(text: str) -> int:
    return max((cell_len(a) for a in atoms(text)), default=0)


class Cell(Text):
    """A Text that wraps only between atoms: rich folds a word only when it is wider than its column, and the
    columns of Table are never that narrow."""

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        m = super().__rich_measure__(console, options)
        return Measurement(max(widest_atom(self.plain), 0) or m.minimum, m.maximum)

    def wrap(self, console: Console, width: int, **kwargs):  # type: ignore[override]
        glued = _glued(self.plain)
        if glued == self.plain:
            return super().wrap(console, width, **kwargs)
        protected = self.copy()
        protected.plain = glued
        lines = Text.wrap(protected, console, width, **kwargs)
        for line in lines:
            line.plain = line.plain.replace(_GLUE, " ")
        return lines


def cell(value) -> object:
    """A table cell as a Cell: a string as it is (gpuvs prints with markup off: names come from jobs), a Text with
    its styles; anything else as it is."""
    if isinstance(value, str):
        value = Text(value)
    if isinstance(value, Text) and not isinstance(value, Cell):
        out = Cell(value.plain, style=value.style, justify=value.justify, overflow=value.overflow,
                   no_wrap=value.no_wrap, end=value.end)
        out.spans = list(value.spans)
        return out
    return value


class Table(rich_table.Table):
    """rich's Table that wraps between atoms instead of cutting, and spreads or stacks when it cannot fit (module
    docstring). A column declared no_wrap (an id people copy) keeps its cells whole: the table spreads or
    stacks before it would wrap one."""

    def add_column(self, header="", *args, **kwargs) -> None:  # type: ignore[override]
        if kwargs.get("overflow", "ellipsis") == "ellipsis":
            kwargs["overflow"] = "fold"
        super().add_column(header, *args, **kwargs)

    def _get_cells(self, console: Console, column_index: int, column):
        """rich's cells (header included), each a Cell: what is added stays as it was given (a str)."""
        for c in super()._get_cells(console, column_index, column):
            if isinstance(c.renderable, Padding):
                c.renderable.renderable = cell(c.renderable.renderable)
                yield c
            else:
                yield c._replace(renderable=cell(c.renderable))

    def _measure_column(self, console: Console, options: ConsoleOptions, column) -> Measurement:
        """rich's measure, a no_wrap column as wide as its widest cell. Its cells are measured once, at any
        width, then clamped to the page (rich measures every cell again for every layout it tries)."""
        raw = self.__dict__.setdefault("_raw", {})
        key = (column._index, len(column._cells))
        if key not in raw:
            m = super()._measure_column(console, options.update_width(10**6), column)
            raw[key] = Measurement(m.maximum, m.maximum) if column.no_wrap and column.width is None else m
        if column.width is not None:
            return raw[key]
        pad = self._get_padding_width(column._index)
        return raw[key].with_maximum(options.max_width).clamp(
            None if column.min_width is None else column.min_width + pad,
            None if column.max_width is None else column.max_width + pad)

    def _calculate_column_widths(self, console: Console, options: ConsoleOptions) -> List[int]:
        """rich's widths where the widest layout fits; else each column narrowed from its widest, the one with
        the most to spare first, never below its longest atom (rich would narrow the widest column to the next
        widest, below what its cells need)."""
        ranges = [self._measure_column(console, options, c) for c in self.columns]
        widths = [r.maximum or 1 for r in ranges]
        lows = [max(1, r.minimum) for r in ranges]
        excess = sum(widths) - options.max_width
        if excess <= 0 or sum(lows) > options.max_width or self.expand:
            return super()._calculate_column_widths(console, options)
        # a header on one line where the page allows it (a header over three lines reads worst)
        heads = [min(w, cell_len(str(c.header)) + self._get_padding_width(c._index)) if self.show_header else 0
                 for w, c in zip(widths, self.columns)]
        if sum(max(lo, h) for lo, h in zip(lows, heads)) <= options.max_width:
            lows = [max(lo, h) for lo, h in zip(lows, heads)]
        while excess > 0:  # the widest columns with room to spare, down to the next widest or their atoms
            spare = [j for j in range(len(widths)) if widths[j] > lows[j]]
            top = max(widths[j] for j in spare)
            tops = [j for j in spare if widths[j] == top]
            below = max([widths[j] for j in spare if widths[j] < top] + [0])
            step = max(1, min([top - below] + [widths[j] - lows[j] for j in tops]))
            for j in tops:
                cut = min(step, excess)
                widths[j] -= cut
                excess -= cut
        return widths

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        title, caption = self.title, self.caption
        if self.columns and not self._fits(console, options):
            parts = self.split(console, options)
            if not parts:
                yield from self.stacked()
                return
            apart = True
        else:
            parts = []
            widths = self._calculate_column_widths(console, options.update_width(options.max_width - self._extra_width))
            apart = max(widest_atom(str(title or "")), widest_atom(str(caption or ""))) > sum(widths) + self._extra_width
        if apart:  # the title and caption at the page's width: the table is narrower than a word of them
            self.title = self.caption = None
        else:
            self.title, self.caption = cell(title), cell(caption)  # wrapped between atoms too
        try:
            if apart and title:
                yield cell(Text(str(title), style=console.get_style(self.title_style or "table.title")))
            yield from parts or super().__rich_console__(console, options)
            if apart and caption:
                yield cell(Text(str(caption), style=console.get_style(self.caption_style or "table.caption")))
        finally:
            self.title, self.caption = title, caption

    def _fits(self, console: Console, options: ConsoleOptions) -> bool:
        return self.__rich_measure__(console, options).minimum <= options.max_width

    def key_columns(self) -> list[int]:
        """The columns that name a row: the first, and the second too where the first repeats (a metric per arm)."""
        first = [str(c) for c in self.columns[0].cells]
        return [0] if len(set(first)) == len(first) or len(self.columns) < 3 else [0, 1]

    def split(self, console: Console, options: ConsoleOptions, most: int = 3) -> list[Table]:
        """The table as up to `most` tables that fit where it does not: each with the key columns and the next
        columns that fit (no title or caption: the caller prints them); [] where that takes more."""
        key = self.key_columns()
        rest = [i for i in range(len(self.columns)) if i not in key]
        groups: list[list[int]] = []
        for i in rest:
            if groups and self._part(groups[-1] + [i], key)._fits(console, options):
                groups[-1].append(i)
            elif self._part([i], key)._fits(console, options) and len(groups) < most:
                groups.append([i])
            else:
                return []
        if len(groups) < 2:
            return []
        return [self._part(g, key) for g in groups]

    def _part(self, columns: list[int], key: list[int]) -> Table:
        """A table of the key columns and `columns`, rows and their styles as they are, no title or caption."""
        import dataclasses

        part = Table(show_header=self.show_header, box=self.box, title_justify=self.title_justify,
                     caption_justify=self.caption_justify, show_edge=self.show_edge, pad_edge=self.pad_edge,
                     padding=self.padding, header_style=self.header_style, title_style=self.title_style,
                     caption_style=self.caption_style, show_lines=self.show_lines)
        part.columns = [dataclasses.replace(self.columns[i], _index=n, _cells=list(self.columns[i]._cells))
                        for n, i in enumerate(key + columns)]
        part.rows = list(self.rows)
        raw = self.__dict__.get("_raw", {})  # what this table measured, for the same cells
        part.__dict__["_raw"] = {(n, len(part.columns[n]._cells)): raw[(i, len(self.columns[i]._cells))]
                                 for n, i in enumerate(key + columns)
                                 if self.pad_edge and (i, len(self.columns[i]._cells)) in raw}
        return part

    def stacked(self) -> Iterable[Text]:
        """The table as records: its title, then per row one 'column: value' line per cell (wrapped by the
        console between atoms), a blank line between rows; then its caption."""
        if self.title:
            yield cell(Text(str(self.title), style="italic"))
        headers = [str(c.header) for c in self.columns]
        for i in range(self.row_count):
            style = self.rows[i].style
            for header, column in zip(headers, self.columns):
                value = list(column.cells)[i]
                value = value if isinstance(value, Text) else Text(str(value))
                yield cell(Text.assemble((f"{header}: " if header else ""), value, style=style or ""))
            if i < self.row_count - 1:
                yield Text("")
        if self.caption:
            yield cell(Text(str(self.caption), style="dim"))
