"""Options shared by the commands that run workloads (run, compare, share, ...), declared with the
same Param type workloads use, and one parser for `--name value`, `--name=value` and flags.
Workload parameters and these options are parsed together, so every command refuses an unknown
option with the list of known ones, before anything starts."""

from __future__ import annotations

from typing import Any, Sequence

from gpuvs import environments
from gpuvs.errors import UsageError
from gpuvs.params import Param
from gpuvs.spec import EnvSpec

RUN_OPTIONS = (
    Param("device", str, None, "cuda, cuda:N or cpu (default: cuda when a GPU is present, else cpu)"),
    Param("num_gpus", int, 1, "data-parallel processes, one per GPU (on cpu: gloo processes)", min=1, max=1024),
    Param("trials", int, 1, "trials, each in a fresh worker process", min=1, max=10000),
    Param("store", str, "gpuvs.db", "SQLite file that keeps every result"),
    Param("timeout", float, 3600.0, "seconds a trial may take before it is stopped and marked failed", min=0.001),
    Param("retries", int, 0, "times a crashed or timed-out trial is run again", min=0, max=100),
    Param("telemetry_interval", float, 0.1, "seconds between NVML readings (0: off)", min=0.0, max=3600.0),
    Param("order_seed", int, None, "seed of the shuffled trial order (default: random; stored with the experiment). "
          "A workload's own --seed seeds its weights and data", min=0),
    Param("name", str, None, "a name for this experiment in the store"),
    Param("quiet", bool, False, "no step log; per-trial lines and the summary only"),
)

# Every environment kind's options, `--env` first (owned by the environments registry).
ENV_OPTIONS = environments.params()


def env_groups() -> list[tuple[str, tuple[Param, ...]]]:
    """(title, options) per environment kind, for help tables."""
    out = [("environment", (environments.env_param(),))]
    for name in environments.names():
        cls = environments.kind(name)
        if cls.params:
            out.append((f"--env {name} options ({cls.summary})", cls.params))
    return out


_BOOL_WORDS = ("true", "false", "yes", "no", "on", "off", "1", "0")


def find(groups: Sequence[Sequence[Param]], option: str) -> Param | None:
    name = option.lstrip("-").replace("-", "_")
    for group in groups:
        for p in group:
            if p.named(name):
                return p
    return None


def parse(args: list[str], groups: Sequence[Sequence[Param]], positional: int = 1,
          what: str = "this command") -> tuple[list[str], dict[Param, Any]]:
    """Split args into positionals (at most `positional`) and raw option values keyed by the Param
    that owns them (the first group that knows a name wins). Values are checked later, by that Param."""
    positionals: list[str] = []
    values: dict[Param, Any] = {}
    i = 0
    while i < len(args):
        tok = args[i]
        if tok == "--":
            positionals.extend(args[i + 1:])
            break
        if tok.startswith("--") and len(tok) > 2:
            opt, eq, val = tok.partition("=")
            p = find(groups, opt)
            if p is None:
                known = ", ".join(q.option for g in groups for q in g)
                raise UsageError(f"unknown option {opt} for {what}; options: {known}")
            i = _store(values, p, args, i, opt, eq, val)
        elif tok.startswith("-") and len(tok) > 1 and not _is_number(tok):
            raise UsageError(f"unknown option {tok} for {what} (options are spelled --name value)")
        else:
            positionals.append(tok)
        i += 1
    if len(positionals) > positional:
        raise UsageError(f"unexpected argument {positionals[positional]!r} for {what}")
    return positionals, values


def _store(values: dict[Param, Any], p: Param, args: list[str], i: int, opt: str, eq: str, val: str) -> int:
    """Record the value of option `p` found at args[i] (its value inline, next, or a flag's); the index
    of the last token it used."""
    if p.type is bool and not eq:
        # a flag; a following true/false word is its value (--check false)
        if i + 1 < len(args) and args[i + 1].lower() in _BOOL_WORDS:
            i += 1
            val = args[i]
        else:
            val = "true"
    elif not eq:
        if i + 1 >= len(args):
            raise UsageError(f"{opt} needs a value: {p.describe_allowed()}")
        i += 1
        val = args[i]
    if p.multiple:
        values.setdefault(p, []).append(val)
    else:
        values[p] = val
    return i


def take_out(args: list[str], group: Sequence[Param]) -> tuple[dict[Param, Any], list[str]]:
    """A command's own options taken out of args before the shared parsing (so that they win over an
    environment option of the same name, e.g. gpuvs fleet's --label): (raw values, the other args)."""
    values: dict[Param, Any] = {}
    rest: list[str] = []
    i = 0
    while i < len(args):
        tok = args[i]
        opt, eq, val = tok.partition("=")
        p = find((group,), opt) if tok.startswith("--") and len(tok) > 2 else None
        if p is None:
            rest.append(tok)
        else:
            i = _store(values, p, args, i, opt, eq, val)
        i += 1
    return values, rest


def _is_number(tok: str) -> bool:
    try:
        float(tok)
        return True
    except ValueError:
        return False


def take(values: dict[Param, Any], group: Sequence[Param]) -> dict[str, Any]:
    """Checked values of one group by name (defaults filled), removing them from `values`."""
    return {p.name: p.coerce(values.pop(p)) if p in values else p.default for p in group}


def raw(values: dict[Param, Any], group: Sequence[Param]) -> dict[str, Any]:
    """Unchecked values of one group by name (only those given), removing them from `values`."""
    return {p.name: values.pop(p) for p in group if p in values}


def env_spec(opts: dict[str, Any]) -> EnvSpec:
    """EnvSpec from checked ENV_OPTIONS values (see environments.env_spec)."""
    return environments.env_spec(opts)
