"""The terminal's tables: cells from a trace are data, and a long kernel name gives way to figures."""

from __future__ import annotations

from typing import Final

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.style import StyleType
from rich.table import Table
from rich.text import Text

from traceinsight.formatting import short_kernel_name, shorten_distinct

__all__ = ["DataTable", "KernelTable", "data"]


def data(value: object) -> Text:
    """A value from the trace, shown as it is: never read as markup."""
    return Text(str(value))


class DataTable(Table):
    """A table whose string cells are shown as written: trace strings are data, never rich markup."""

    def add_row(
        self, *renderables: RenderableType | None, style: StyleType | None = None, end_section: bool = False
    ) -> None:
        cells = (Text(cell) if isinstance(cell, str) else cell for cell in renderables)
        super().add_row(*cells, style=style, end_section=end_section)


class KernelTable:
    """A table of kernels (GPU, name, figures) made when its width is known: the figures keep their
    full width and the name takes what is left, cut with an ellipsis (rich would cut every column,
    figures included, when a long name does not fit 80 columns)."""

    #: Each column's padding (1 either side) and the rule between columns.
    _OVERHEAD: Final = 3

    def __init__(
        self, title: str, columns: tuple[str, ...], rows: list[tuple[int, str, tuple[str, ...]]]
    ) -> None:
        self.title = title
        self.columns = columns
        self.rows = rows

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        widths = [
            max(len(column), *(len(figures[i]) for _, _, figures in self.rows))
            for i, column in enumerate(self.columns)
        ]
        fixed = 3 + sum(widths) + self._OVERHEAD * (len(widths) + 2)
        room = max(options.max_width - fixed, 16)
        table = DataTable(title=self.title, title_justify="left", show_edge=False)
        table.add_column("GPU", no_wrap=True, min_width=3)
        table.add_column("kernel", overflow="ellipsis", no_wrap=True, max_width=room)
        for column, width in zip(self.columns, widths, strict=True):
            table.add_column(column, justify="right", no_wrap=True, min_width=width)
        limit = min(room, 100)
        names = shorten_distinct([short_kernel_name(name, 10**6) for _, name, _ in self.rows], limit)
        for (device, _, figures), name in zip(self.rows, names, strict=True):
            table.add_row(str(device), data(name), *figures)
        yield table
