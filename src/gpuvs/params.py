"""Param: the option schema of the whole project (name, type, default, limits, choices).

Workloads, environment kinds and commands declare their options with it.
So bad input is refused with one line before anything starts. Neutral: it imports nothing of gpuvs but its errors."""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any

from gpuvs.errors import UsageError

_TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
# An integer without a declared limit still fits a signed 64-bit column (SQLite's INTEGER, JSON readers)
INT_LIMIT = 2 ** 63 - 1
SHOWN_CHARS = 40  # a refused value is shown this long at most: the message stays one line


def _limit(v: float) -> str:
    """A limit as people read it: 4096, 1,048,576 (never 1.04858e+06), 0.5."""
    if float(v).is_integer():
        return f"{int(v):,}" if abs(v) >= 1e5 else str(int(v))
    return f"{v:g}"


@dataclass(frozen=True)
class Param:
    name: str
    type: type
    default: Any
    help: str = ""
    choices: tuple[Any, ...] | None = None
    min: float | None = None
    max: float | None = None
    multiple: bool = False  # may be given more than once; the value is a list
    aliases: tuple[str, ...] = ()  # other names that reach this parameter (one letter: a short option, -o)
    required: bool = False  # the command line refuses to go on without it ("Missing option '--image'.")

    def named(self, name: str) -> bool:
        return name == self.name or name in self.aliases

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    def describe_allowed(self) -> str:
        if self.choices:
            return "one of " + ", ".join(str(c) for c in self.choices)
        word = _TYPE_WORDS[self.type]
        if self.min is not None and self.max is not None:
            return f"{word} from {self._bound(self.min)} to {self._bound(self.max)}"
        if self.min is not None:
            return f"{word} >= {self._bound(self.min)}"
        if self.max is not None:
            return f"{word} <= {self._bound(self.max)}"
        return word

    def _bound(self, value: float) -> str:
        return _limit(int(value) if self.type is int else value)

    def coerce(self, raw: Any) -> Any:
        """Typed, checked value; UsageError naming the option and what is allowed."""
        if raw is None:
            return None
        if self.multiple:
            items = raw if isinstance(raw, (list, tuple)) else [raw]
            return [self._coerce_one(item) for item in items]
        return self._coerce_one(raw)

    def _coerce_one(self, raw: Any) -> Any:
        value = self._typed(raw)
        if value is None:
            raise self._bad(raw)
        if self.choices:
            matches = [c for c in self.choices if str(c).lower() == str(value).lower()]
            if not matches:
                raise self._bad(raw)
            value = matches[0]
        if (self.min is not None and value < self.min) or (self.max is not None and value > self.max):
            raise self._bad(raw)
        if self.type is int and abs(value) > INT_LIMIT:  # an integer without a limit of its own still has one
            raise self._bad(raw, f" (within ±{INT_LIMIT})")
        return value

    def _typed(self, raw: Any) -> Any:
        """raw as this Param's type, or None where it is not one (a list or mapping for one value, a bool for a
        number, a number that is not an integer, NaN or an infinity, a word that is none of true/false)."""
        if isinstance(raw, (list, tuple, dict, set)):
            return None
        if self.type is bool:
            if isinstance(raw, bool):
                return raw
            word = str(raw).lower()
            return True if word in ("1", "true", "yes", "on") else False if word in ("0", "false", "no", "off") \
                else None
        if self.type is str:
            return str(raw)
        if isinstance(raw, bool):
            return None
        try:
            if self.type is int:
                if isinstance(raw, float):
                    return int(raw) if raw.is_integer() else None
                # int() of a string longer than Python's limit (4,300 digits) is a ValueError, caught here
                return int(raw.strip(), 10) if isinstance(raw, str) else int(raw)
            value = float(raw)
        except (TypeError, ValueError, OverflowError):
            return None
        return value if math.isfinite(value) else None  # NaN passes every comparison; infinity is no setting

    def _bad(self, raw: Any, note: str = "") -> UsageError:
        """The one line that refuses raw, built only when refusing: raw shown short, whatever its size."""
        digits = raw.strip().lstrip("+-") if isinstance(raw, str) else ""
        if self.type is int and len(digits) > 18 and digits.isdigit() and (self.min is None or self.max is None):
            note = f" (within ±{INT_LIMIT})"
        if self.type is float and _non_finite(raw):
            note = " (NaN and infinities are not allowed)"
        return UsageError(f"{self.option}: {shown(raw)} is not allowed; expected {self.describe_allowed()}{note}")


def _non_finite(raw: Any) -> bool:
    try:
        return not math.isfinite(float(raw))
    except (TypeError, ValueError, OverflowError):
        return False


def shown(raw: Any) -> str:
    """A value as an error message shows it: its repr, cut to SHOWN_CHARS with its full length said. Never builds
    the whole repr of a huge value (an int of 5,000 digits has none in Python 3.11; a nested list may take GBs)."""
    if isinstance(raw, int) and not isinstance(raw, bool) and raw.bit_length() > 128:
        return f"an integer of about {int(raw.bit_length() * 0.30103)} digits"
    if isinstance(raw, (list, tuple, dict, set)):
        return f"a {'mapping' if isinstance(raw, dict) else 'list'} of {len(raw)} item(s)"
    text = repr(raw)
    if len(text) > SHOWN_CHARS:
        return f"{text[:SHOWN_CHARS]}... ({len(str(raw))} characters)"
    return text


def refuse_unknown(names, known, what: str) -> None:
    """One line for the first name of `names` that is not in `known`, as the command line words it: "unknown
    option --x for WHAT (did you mean '--y'?); it takes --a, --b". Every mapping of options a library caller gives is checked here."""
    options = [str(k).replace("_", "-") for k in known]
    for name in names:
        if name not in known:
            dashed = str(name).replace("_", "-")
            raise UsageError(f"unknown option --{dashed} for {what}{did_you_mean(dashed, options, prefix='--')}; "
                             f"it takes {', '.join('--' + o for o in options)}")


def did_you_mean(word: str, known, n: int = 1, prefix: str = "") -> str:
    """' (did you mean 'steps'?)' where known names are close to the word given (difflib's ratio of 0.7 or more:
    'stepz' and 'steps' are, 'seed' and 'stored' are not), the closest `n` of them, each shown after `prefix`;
    else ''. Every refusal of an unknown name says it: file keys, arm keys, parameters, options."""
    close = [repr(prefix + c) for c in difflib.get_close_matches(word, sorted(set(known)), n=n, cutoff=0.7)]
    if not close:
        return ""
    return f" (did you mean {close[0] if len(close) == 1 else ', '.join(close[:-1]) + ' or ' + close[-1]}?)"
