"""Every table gpuvs prints on a terminal, a pipe or a CI log (80 columns): never cut. A cell too wide for its
column wraps at its spaces (a long word folds) instead of ending in '…'; a table whose narrowest layout is
still wider than the page is printed stacked, a record per row ('column: value' lines), so every word
of every cell reaches the reader at any width."""

from __future__ import annotations

from typing import Iterable

from rich import table as rich_table
from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text


class Table(rich_table.Table):
    """rich's Table that wraps instead of cutting, and stacks when it cannot fit (module docstring).
    A column declared no_wrap (an id people copy) keeps its cells whole: the table stacks before it
    would cut one."""

    def add_column(self, header="", *args, **kwargs) -> None:  # type: ignore[override]
        if kwargs.get("overflow", "ellipsis") == "ellipsis":
            kwargs["overflow"] = "fold"
        super().add_column(header, *args, **kwargs)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if not self.columns or self.__rich_measure__(console, options).minimum <= options.max_width:
            yield from super().__rich_console__(console, options)
            return
        yield from self.stacked()

    def stacked(self) -> Iterable[Text]:
        """The table as records: its title, then per row one 'column: value' line per cell (wrapped by the
        console at spaces), a blank line between rows; then its caption."""
        if self.title:
            yield Text(str(self.title), style="italic")
        headers = [str(c.header) for c in self.columns]
        for i in range(self.row_count):
            style = self.rows[i].style
            for header, column in zip(headers, self.columns):
                cell = list(column.cells)[i]
                value = cell if isinstance(cell, Text) else Text(str(cell))
                yield Text.assemble((f"{header}: " if header else ""), value, style=style or "")
            if i < self.row_count - 1:
                yield Text("")
        if self.caption:
            yield Text(str(self.caption), style="dim")
