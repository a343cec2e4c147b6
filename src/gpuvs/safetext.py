"""Text that came from a job or its environment, made safe to show: safe_text() escapes what a terminal would act on.

A job's escape sequences could retitle the terminal, write the clipboard or hide what follows (docs/command.md).
Escape where text is shown, never where it is kept; escaping twice changes nothing; backslashes are left alone.
Standard library only: job.py, which runs inside the user's image, uses it."""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache
from typing import Any


_NAMED = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}


def _escape(cp: int) -> str:
    if cp in _NAMED:
        return _NAMED[cp]
    if cp < 0x100:
        return f"\\x{cp:02x}"
    return f"\\u{cp:04x}" if cp < 0x10000 else f"\\U{cp:08x}"  # as Python writes them: U+E0041 is \\U000e0041


def _format_characters() -> list[int]:
    """Category Cf as this Python's Unicode knows it: every one lies in planes 0, 1 and 14 (scanning them takes
    about 20 ms, so it is done once, on first use)."""
    return [cp for block in (range(0x20000), range(0xE0000, 0xE1000)) for cp in block
            if unicodedata.category(chr(cp)) == "Cf"]


@lru_cache(maxsize=2)
def _table(kept: str) -> dict[int, str]:
    codes = [*range(0x20), 0x7F, *range(0x80, 0xA0), 0x2028, 0x2029, *_format_characters()]
    table = {cp: _escape(cp) for cp in codes if chr(cp) not in kept}
    for cp in range(0xD800, 0xE000):  # lone surrogates; U+DC80..U+DCFF are bytes that were not UTF-8
        table[cp] = _escape(cp - 0xDC00) if 0xDC80 <= cp <= 0xDCFF else _escape(cp)
    return table


def safe_text(text: Any, lines: bool = False) -> str:
    """`text` (str, bytes, or anything str() takes) with every control character written as a visible escape;
    lines=True keeps newlines and tabs (a multi-line log)."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "surrogateescape")
    elif not isinstance(text, str):
        text = str(text)
    return text.translate(_table("\n\t" if lines else ""))


def clip(text: str, limit: int) -> str:
    """`text` whole if it fits in `limit` characters; otherwise its words up to `limit`, then " …". A word or a
    number is never cut in two (one longer than `limit` alone is cut, and marked)."""
    if len(text) <= limit:
        return text
    head = text[:limit + 1].rsplit(" ", 1)[0] if " " in text[:limit + 1] else text[:limit]
    return head.rstrip() + " …"


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # OWASP's list: a spreadsheet reads such a cell as a formula
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def csv_cell(text: str) -> str:
    """A CSV cell that no spreadsheet runs: text that starts as a formula would (= + - @, tab, carriage return)
    gets a leading single quote, OWASP's rule; a number written as text (-1.5, +3e2) is left as it is."""
    if text.startswith(FORMULA_STARTS) and not _NUMBER.fullmatch(text):
        return "'" + text
    return text


def safe_row(cells: Any) -> list[Any]:
    """A CSV row to print: its text cells through safe_text (a CSV goes to a terminal as often as to a file) and
    csv_cell (a name such as `=HYPERLINK(...)` is not run by the spreadsheet that opens it), its numbers and None
    as they are. JSON needs none of this: it writes every control as a \\u escape itself."""
    return [csv_cell(safe_text(c)) if isinstance(c, (str, bytes)) else c for c in cells]
