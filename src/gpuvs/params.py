"""Param: the option schema of the whole project. Workloads, environment kinds and commands declare
their options with it (name, type, default, limits, choices), so that bad input is refused with one
line before anything starts. Neutral: it imports nothing of gpuvs but its errors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuvs.errors import UsageError

_TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


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
            return f"{word} from {self.min:g} to {self.max:g}"
        if self.min is not None:
            return f"{word} >= {self.min:g}"
        if self.max is not None:
            return f"{word} <= {self.max:g}"
        return word

    def coerce(self, raw: Any) -> Any:
        """Typed, checked value; UsageError naming the option and what is allowed."""
        if raw is None:
            return None
        if self.multiple:
            items = raw if isinstance(raw, (list, tuple)) else [raw]
            return [self._coerce_one(item) for item in items]
        return self._coerce_one(raw)

    def _coerce_one(self, raw: Any) -> Any:
        bad = UsageError(f"{self.option}: {raw!r} is not allowed; expected {self.describe_allowed()}")
        try:
            if self.type is bool:
                if isinstance(raw, bool):
                    value = raw
                elif str(raw).lower() in ("1", "true", "yes", "on"):
                    value = True
                elif str(raw).lower() in ("0", "false", "no", "off"):
                    value = False
                else:
                    raise bad
            elif self.type is int:
                if isinstance(raw, float) and not raw.is_integer():
                    raise bad
                value = int(str(raw), 10) if isinstance(raw, str) else int(raw)
            elif self.type is float:
                value = float(raw)
            else:
                value = str(raw)
        except (TypeError, ValueError):
            raise bad from None
        if self.choices:
            matches = [c for c in self.choices if str(c).lower() == str(value).lower()]
            if not matches:
                raise bad
            value = matches[0]
        if self.min is not None and value < self.min:
            raise bad
        if self.max is not None and value > self.max:
            raise bad
        return value
