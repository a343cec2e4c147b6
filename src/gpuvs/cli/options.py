"""Options shared by the commands that run workloads (run, compare, share, ...), declared with the
same Param type workloads use, and one parser for `--name value`, `--name=value` and flags.
Workload parameters and these options are parsed together, so every command refuses an unknown
option with the list of known ones, before anything starts."""

from __future__ import annotations

from typing import Any, Sequence

from gpuvs.errors import UsageError
from gpuvs.spec import EnvSpec
from gpuvs.workloads.base import Param

RUN_OPTIONS = (
    Param("device", str, None, "cuda, cuda:N or cpu (default: cuda when a GPU is present, else cpu)"),
    Param("num_gpus", int, 1, "data-parallel processes, one per GPU (on cpu: gloo processes)", min=1, max=1024),
    Param("trials", int, 1, "trials, each in a fresh worker process", min=1, max=10000),
    Param("store", str, "gpuvs.db", "SQLite file that keeps every result"),
    Param("timeout", float, 3600.0, "seconds a trial may take before it is stopped and marked failed", min=0.001),
    Param("retries", int, 0, "times a crashed or timed-out trial is run again", min=0, max=100),
    Param("telemetry_interval", float, 0.1, "seconds between NVML readings (0: off)", min=0.0, max=3600.0),
    Param("seed", int, None, "seed of the trial order (default: random)", min=0),
    Param("name", str, None, "a name for this experiment in the store"),
    Param("quiet", bool, False, "no step log; per-trial lines and the summary only"),
)

ENV_OPTIONS = (
    Param("env", str, "host", "where the worker runs", choices=("host", "container")),
    Param("engine", str, None, "container engine (default: podman if present, else docker)",
          choices=("podman", "docker")),
    Param("image", str, None, "container image holding Python and the framework"),
    Param("rootfs", str, None, "podman: a directory (or DIR:O for an overlay) used as the container's root"),
    Param("gpus", str, "auto", "GPU access in a container", choices=("auto", "toolkit", "cdi", "devices", "none")),
    Param("cpus", float, None, "container CPU limit", min=0.01),
    Param("memory", str, None, "container memory limit, e.g. 4g"),
    Param("shm_size", str, None, "container /dev/shm size, e.g. 1g (engines default to 64m)"),
    Param("ulimit", str, None, "container ulimit NAME=SOFT[:HARD], e.g. memlock=-1", multiple=True),
    Param("mount", str, None, "extra mount SRC:DST[:ro]", multiple=True),
    Param("env_var", str, None, "environment variable KEY=VALUE for the worker", multiple=True),
    Param("network", bool, False, "give the container a network (off by default)"),
    Param("engine_arg", str, None, "extra argument passed to the engine's global options", multiple=True),
    Param("python", str, None, "Python interpreter inside the container (default: python3; with --rootfs "
          "over this host, the one gpuvs runs under)"),
)


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
        elif tok.startswith("-") and len(tok) > 1 and not _is_number(tok):
            raise UsageError(f"unknown option {tok} for {what} (options are spelled --name value)")
        else:
            positionals.append(tok)
        i += 1
    if len(positionals) > positional:
        raise UsageError(f"unexpected argument {positionals[positional]!r} for {what}")
    return positionals, values


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
    """EnvSpec from checked ENV_OPTIONS values; options left at None are left out."""
    kind = opts.get("env") or "host"
    options = {k: v for k, v in opts.items() if k != "env" and v not in (None, [], False)}
    if kind == "host":
        extra = [k for k in options if k not in ("env_var", "gpus") or (k == "gpus" and options[k] != "auto")]
        if extra:
            raise UsageError(f"--{extra[0].replace('_', '-')} applies to --env container, not to the host")
        options = {k: v for k, v in options.items() if k == "env_var"}
    for item in options.get("env_var") or []:
        if "=" not in item or not item.split("=", 1)[0]:
            raise UsageError(f"--env-var wants KEY=VALUE, got {item!r}")
    return EnvSpec(kind=kind, options=options)
