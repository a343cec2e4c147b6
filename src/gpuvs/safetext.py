"""Text that came from a job or its environment, made safe to show: what a command printed, error messages built
from its output, an engine's or kubectl's words. A job may print anything; shown raw, its escape sequences would
retitle the terminal, clear the screen, write the clipboard (OSC 52) or hide what follows. safe_text() writes every
character a terminal would act on as a visible escape (ESC as \\x1b, NUL as \\x00, a carriage return as \\r, a
bidi override as \\u202e) and leaves the rest as it was; the store keeps the bytes as the job wrote them: escape
where text is shown, never where it is kept. Escaping twice changes nothing.

Escaped: C0 controls (newline and tab kept where a multi-line log is shown: lines=True), DEL, C1 controls, the
Unicode line and paragraph separators and bidirectional controls, and lone surrogates (an undecodable byte read
with surrogateescape shows as that byte, \\xff; any other lone surrogate as \\udXXX). Backslashes are left alone.
Rich markup is not this module's business: gpuvs's consoles print with markup off.

Standard library only: job.py, which runs inside the user's image, uses it."""

from __future__ import annotations

from typing import Any


_NAMED = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}


def _escape(cp: int) -> str:
    if cp in _NAMED:
        return _NAMED[cp]
    return f"\\x{cp:02x}" if cp < 0x100 else f"\\u{cp:04x}"


def _table(kept: str) -> dict[int, str]:
    codes = [*range(0x20), 0x7F, *range(0x80, 0xA0), 0x061C, 0x200E, 0x200F, 0x2028, 0x2029,
             *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
    table = {cp: _escape(cp) for cp in codes if chr(cp) not in kept}
    for cp in range(0xD800, 0xE000):  # lone surrogates; U+DC80..U+DCFF are bytes that were not UTF-8
        table[cp] = _escape(cp - 0xDC00) if 0xDC80 <= cp <= 0xDCFF else _escape(cp)
    return table


_ONE_LINE = _table("")
_LINES = _table("\n\t")


def safe_text(text: Any, lines: bool = False) -> str:
    """`text` (str, bytes, or anything str() takes) with every control character written as a visible escape;
    lines=True keeps newlines and tabs (a multi-line log)."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "surrogateescape")
    elif not isinstance(text, str):
        text = str(text)
    return text.translate(_LINES if lines else _ONE_LINE)


def safe_row(cells: Any) -> list[Any]:
    """A CSV row to print: its text cells through safe_text (a CSV goes to a terminal as often as to a file), its
    numbers and None as they are. JSON needs none of this: it writes every control as a \\u escape itself."""
    return [safe_text(c) if isinstance(c, (str, bytes)) else c for c in cells]
