"""What a workload is: a name, typed parameters with limits, and a generator of events."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator

from gpuvs.errors import UsageError
from gpuvs.spec import RunSpec

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
    aliases: tuple[str, ...] = ()  # other names that reach this parameter

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


@dataclass
class RunContext:
    """What a workload gets: the spec, its checked parameters, and its place in a multi-process run."""

    spec: RunSpec
    params: dict[str, Any]
    rank: int = 0
    world_size: int = 1
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def device(self) -> str:
        return self.spec.device

    def start_window(self) -> None:
        """Call right before the timed part. Under a start barrier (gpuvs share), report ready, wait
        for every other worker, and open a measurement window of the agreed length."""
        self._window_end = None
        barrier = self.spec.barrier
        if not barrier or self.rank != 0:
            return
        from gpuvs import barrier as b

        b.arrive(barrier["dir"], barrier["name"])
        start = b.wait_go(barrier["dir"], barrier.get("wait_s", 1800.0))
        if barrier.get("window_s"):
            import time

            self._window_end = time.perf_counter() + (start + barrier["window_s"] - time.time())

    def window_open(self) -> bool:
        """False once the agreed window is over (always True without a barrier)."""
        end = getattr(self, "_window_end", None)
        if end is None:
            return True
        import time

        return time.perf_counter() < end


class Workload:
    """Subclass, set the class attributes, implement run(). Never print: yield events."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    params: ClassVar[tuple[Param, ...]] = ()
    unit: ClassVar[str] = "items/sec"
    multi_gpu: ClassVar[bool] = False
    # True where run() calls ctx.start_window() before its timed part and stops when
    # ctx.window_open() turns False: such a workload can share a GPU in a measured window.
    windowed: ClassVar[bool] = False
    window_param: ClassVar[str] = "steps"  # the count a shared window replaces (set very high under share)
    # Python modules the worker needs inside the environment (checked by environments/doctor).
    requires: ClassVar[tuple[str, ...]] = ()
    # Defaults that replace the GPU-sized ones when the device is the CPU (so a default run ends
    # in minutes there); a value the user gives always wins.
    cpu_defaults: ClassVar[dict[str, Any]] = {}

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.named(name):
                return p
        raise UsageError(f"{self.name} has no parameter {name!r}; it takes: {self.param_list()}")

    def param_list(self) -> str:
        return ", ".join(p.option for p in self.params) or "(none)"

    def defaults(self, device: str | None = None) -> dict[str, Any]:
        values = {p.name: p.default for p in self.params}
        if device is not None and device.split(":")[0] == "cpu":
            values.update(self.cpu_defaults)
        return values

    def validate(self, raw: dict[str, Any], device: str | None = None) -> dict[str, Any]:
        """Fill defaults (the CPU's where device is cpu), coerce types, refuse unknown names; then
        cross-field checks."""
        values = self.defaults(device)
        for key, value in raw.items():
            param = self.param(key.replace("-", "_"))
            values[param.name] = param.coerce(value)
        self.check(values)
        return values

    def check(self, params: dict[str, Any]) -> None:
        """Cross-parameter checks; raise UsageError."""

    def run(self, ctx: RunContext) -> Iterator[dict[str, Any]]:
        raise NotImplementedError
