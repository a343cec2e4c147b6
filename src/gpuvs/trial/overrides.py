"""What an arm changes of its base spec: RunSpec fields, `env`, environment options and workload parameters.

Overrides.sort sorts them once and Overrides.apply lays them over the base.
A file's keys, `--arm NAME:key=value` and an Arm built in code all pass through sort(): a key means one thing.
Given the workload, sort() types each value and refuses a key that is none of the four; else keys are parameters."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

from gpuvs import environments
from gpuvs.errors import UsageError
from gpuvs.params import Param, did_you_mean
from gpuvs.spec import EnvSpec, RunSpec, check_device_syntax
from gpuvs.trial.launch import FRESH

# RunSpec fields an arm may set directly; any other key is env, an environment option or a workload parameter.
SPEC_FIELDS = ("device", "num_gpus", "telemetry_interval_s", "timeout_s", "fresh")
SPEC_PARAMS = {
    "device": Param("device", str, None, "cuda, cuda:N or cpu"),
    "num_gpus": Param("num_gpus", int, 1, "data-parallel processes", min=1, max=1024),
    "timeout_s": Param("timeout_s", float, None, "seconds a trial may take", min=0.001),
    "telemetry_interval_s": Param("telemetry_interval_s", float, 0.1, "seconds between NVML readings",
                                  min=0.0, max=3600.0),
    "fresh": FRESH,
}
ALIASES = {"timeout": "timeout_s", "telemetry_interval": "telemetry_interval_s"}  # the CLI's spellings
COMMAND_KEY = "command"  # a file's (and an arm's) command line: the argv of a workload that takes one


def normalise_key(key: Any) -> str:
    key = str(key).strip().replace("-", "_")
    return ALIASES.get(key, key)


def spec_field(option: str) -> str | None:
    """The RunSpec field a run option sets (`timeout` -> `timeout_s`), else None: the one map from the command
    line's names, used by the command line, experiment files and the agent alike."""
    key = normalise_key(option)
    return key if key in SPEC_FIELDS else None


class OverrideError(UsageError):
    """A key or value sort() refuses; `key` is the key as it was written (its place in a file)."""

    def __init__(self, key: Any, message: str):
        super().__init__(message)
        self.key = key


@dataclass(frozen=True, eq=False)
class Overrides(Mapping[str, Any]):
    """An arm's overrides, sorted. As a mapping it reads as written (key order kept): what the store keeps
    with the experiment (records.ArmMeta) and what reports list."""

    fields: dict[str, Any] = field(default_factory=dict)  # RunSpec fields (SPEC_FIELDS)
    env: str | None = None  # the environment kind
    options: dict[str, Any] = field(default_factory=dict)  # environment options
    params: dict[str, Any] = field(default_factory=dict)  # workload parameters
    order: tuple[str, ...] = ()

    @classmethod
    def sort(cls, raw: Mapping[str, Any], workload=None) -> Overrides:
        """Each key into its place, typed; OverrideError naming the key otherwise (see the module's doc)."""
        sorted_ = cls()
        env, order = None, []
        env_keys = environments.option_keys()
        written_as: dict[str, Any] = {}
        for written, value in raw.items():
            key = normalise_key(written)
            if key in written_as:  # batch-size and batch_size, timeout and timeout_s: one key written twice
                raise OverrideError(written, f"key {key!r} is given twice (as {written_as[key]!r} and {written!r}); "
                                             "give each key once")
            written_as[key] = written
            try:
                place, key, value = _place(workload, key, value, env_keys)
            except UsageError as exc:
                raise OverrideError(written, str(exc)) from None
            if place == "env":
                env = value
            else:
                getattr(sorted_, place)[key] = value
            if key not in order:
                order.append(key)
        return dataclasses.replace(sorted_, env=env, order=tuple(order))

    def apply(self, base: RunSpec) -> RunSpec:
        """A copy of `base` with these overrides laid over it. An arm that switches the kind keeps the base's
        options that kind takes (a file's top-level image reaches its container and pod arms, not its host arm)."""
        spec = copy.deepcopy(base)
        spec.params = {**spec.params, **self.params}
        for key, value in self.fields.items():
            setattr(spec, key, value)
        if self.env is not None:
            spec.env = EnvSpec(kind=self.env, options=environments.options_for(self.env, base.env.options))
        if self.options:
            spec.env = EnvSpec(kind=spec.env.kind, options={**spec.env.options, **self.options})
        return spec

    def replace_field(self, key: str, value: Any) -> Overrides:
        """These overrides with one RunSpec field set (the runner's --fresh auto, resolved)."""
        order = self.order if key in self.order else (*self.order, key)
        return dataclasses.replace(self, fields={**self.fields, key: value}, order=order)

    def __getitem__(self, key: str) -> Any:
        if key == "env" and self.env is not None:
            return self.env
        for bucket in (self.fields, self.options, self.params):
            if key in bucket:
                return bucket[key]
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.order)

    def __len__(self) -> int:
        return len(self.order)

    def __repr__(self) -> str:
        return f"Overrides({dict(self)!r})"


def _place(workload, key: str, value: Any, env_keys: tuple[str, ...]) -> tuple[str, str, Any]:
    """(where the key goes, its name, its typed value)."""
    if workload is not None:
        if key == COMMAND_KEY and workload.argv_param:
            key = workload.argv_param
        if key in workload.fixed_params:
            raise UsageError(f"{key} cannot differ between arms: it says which figures a trial gives and how they "
                             f"are read, and arms are compared figure by figure (set it for the whole comparison)")
    if key in SPEC_FIELDS:
        value = SPEC_PARAMS[key].coerce(value)
        if key == "device":
            check_device_syntax(value)
        return "fields", key, value
    if key == "env":
        return "env", key, environments.kind(str(value)).kind
    if key in env_keys:
        param = environments.param(key)
        return "options", key, value if param is None else param.coerce(value)
    if workload is None:
        return "params", key, value
    names = {p.name for p in workload.params}
    if key in names:
        return "params", key, workload.param(key).coerce(value)
    hint = did_you_mean(key, names | set(SPEC_FIELDS) | set(env_keys) | {"env"})
    raise UsageError(f"unknown key {key!r}{hint}: not a run-spec field ({', '.join(SPEC_FIELDS)}), env, an "
                     f"environment option or a {workload.name} parameter ({', '.join(sorted(names))})")
