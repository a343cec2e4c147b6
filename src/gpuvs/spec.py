"""RunSpec and its parts: plain data, serialisable to JSON, the one input of a worker."""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from gpuvs.errors import UsageError


def new_run_id() -> str:
    """A trial attempt's id: 12 random hex digits (each retry gets a new one)."""
    return uuid.uuid4().hex[:12]


@dataclass
class EnvSpec:
    """Where a worker runs: an environment kind (see gpuvs.environments, which owns the kinds and
    their options) and that kind's options, validated by the environment."""

    kind: str = "host"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunSpec:
    """One trial of one workload, in one environment, on one device."""

    workload: str
    params: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    num_gpus: int = 1
    env: EnvSpec = field(default_factory=EnvSpec)
    trial: int = 0
    arm: str = "default"
    experiment_id: str = ""
    telemetry_interval_s: float = 0.1
    timeout_s: float | None = None
    launched_at: float | None = None  # wall clock when the launcher started the worker
    fresh: str = "auto"  # how the trial's process starts: exec, fork (from a zygote), auto (launch.py decides)
    # Start barrier for workers that must measure the same window (sharing/group.py):
    # {"dir": path, "name": this worker's name, "window_s": seconds or None, "wait_s": seconds}
    barrier: dict[str, Any] | None = None
    run_id: str = field(default_factory=new_run_id)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSpec:
        data = dict(data)
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise UsageError(f"unknown run-spec field(s): {', '.join(sorted(unknown))}")
        env = data.pop("env", None) or {}
        spec = cls(**data)
        spec.env = env if isinstance(env, EnvSpec) else EnvSpec(**env)
        return spec

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        return cls.from_dict(json.loads(text))


def parse_kv(items: list[str] | None) -> dict[str, str]:
    """Parse ["a=1", "b=x"] into {"a": "1", "b": "x"}; refuse anything without '='."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"expected KEY=VALUE, got {item!r}")
        out[key.strip().replace("-", "_")] = value
    return out


def device_kind(device: str) -> str:
    """'cuda:1' -> 'cuda'; 'cpu' -> 'cpu'."""
    return device.split(":", 1)[0]


def nodes_asked(spec: RunSpec) -> int:
    """How many nodes one trial spans: --num-nodes (one pod per node; only an environment kind that spans nodes
    takes it, and a spec's options are its kind's own), else 1."""
    return int(spec.env.options.get("num_nodes") or 1)


def ranks_asked(spec: RunSpec) -> int:
    """The trial's world size: --num-gpus ranks in each of its nodes' pods."""
    return spec.num_gpus * nodes_asked(spec)


def gpus_asked(spec: RunSpec) -> int:
    """How many GPUs a run asks for: its --num-gpus on a GPU device, none on the CPU."""
    return spec.num_gpus if device_kind(spec.device) == "cuda" else 0


def check_device_syntax(device: str) -> None:
    kind, _, index = device.partition(":")
    if kind not in ("cuda", "cpu") or (index and (kind == "cpu" or not index.isdigit())):
        raise UsageError(f"unknown device {device!r}: use cuda, cuda:N or cpu")
