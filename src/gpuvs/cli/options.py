"""Option groups that several commands share, declared with the Param type workloads use.

The run options (run, compare, share, fleet, advise-mps), the environment options (the registry's), and the store.
A command lists the groups it takes in its Command."""

from __future__ import annotations

from typing import Any

from gpuvs import environments
from gpuvs.cli.declaration import Group
from gpuvs.trial.launch import FRESH
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
# The run options of the commands that run trials one after another (run, compare): and how each starts.
TRIAL_OPTIONS = RUN_OPTIONS + (FRESH,)

# The store of the commands that read results (results, report, compare --stored).
STORE = Param("store", str, "gpuvs.db", "SQLite file that keeps the results")

# Every environment kind's options, `--env` first (owned by the environments registry).
ENV_OPTIONS = environments.params()


def run_group(params: tuple[Param, ...] = RUN_OPTIONS) -> Group:
    return Group("run options", params, "run")


def env_groups(kinds: list[str] | None = None, env: Param | None = None) -> list[Group]:
    """`--env` and one group per environment kind (`kinds`: only those), keyed "env", for a command's
    declaration: help shows one table per kind, and the parser takes the options of them all."""
    out = [Group("environment", (env or environments.env_param(),), "env")]
    for name in environments.names() if kinds is None else kinds:
        cls = environments.kind(name)
        if cls.params:
            out.append(Group(f"--env {name} options ({cls.summary})", cls.params, "env"))
    return out


def env_spec(opts: dict[str, Any]) -> EnvSpec:
    """EnvSpec from checked environment option values (args.group("env"); see environments.env_spec)."""
    return environments.env_spec(opts)
