"""gpuvs info, gpuvs workloads."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from gpuvs import fingerprint, workloads
from gpuvs.cli import app


@app.command()
def info(as_json: bool = typer.Option(False, "--json", help="print the fingerprint as JSON")) -> None:
    """Print this environment's fingerprint: GPUs, driver, CUDA, frameworks, CPU, memory, cgroup limits."""
    fp = fingerprint.take()
    if as_json:
        print(json.dumps(fp, indent=2, default=str))
        return
    console = Console(markup=False, highlight=False)
    t = Table(title="gpuvs info", show_header=False, title_justify="left")
    t.add_column("what", style="bold")
    t.add_column("value")
    limits = fp.get("limits") or {}
    rows = [
        ("GPUs", ", ".join(f"{g['index']}: {g['name']} ({g['memory_mib']} MiB, cc {g.get('compute_capability', '?')}, "
                           f"{g['uuid']})" for g in fp["gpus"]) or f"none ({fp.get('nvml_error', 'NVML found none')})"),
        ("NVIDIA driver", fp.get("driver")), ("CUDA (driver)", fp.get("cuda_driver")),
        ("torch", fp.get("torch")), ("CUDA (torch)", fp.get("cuda")), ("cuDNN", fp.get("cudnn")),
        ("torchvision", fp.get("torchvision")),
        ("CPU", f"{fp.get('cpu_model')} ({fp.get('cpu_usable')} of {fp.get('cpu_count')} usable)"),
        ("memory", f"{fp.get('memory_mib')} MiB"),
        ("cgroup", limits.get("cgroup")),
        ("CPU limit", limits.get("cpu_limit") or "none"),
        ("memory limit", f"{limits['memory_limit_mib']} MiB" if limits.get("memory_limit_mib") else "none"),
        ("/dev/shm", f"{limits.get('shm_mib')} MiB"),
        ("container", (fp.get("container_image") or fp.get("engine") or "yes") if fp.get("in_container") else "no"),
        ("node", fp.get("node_name")), ("python", fp.get("python")), ("os", fp.get("os")), ("gpuvs", fp.get("gpuvs")),
    ]
    for k, v in rows:
        t.add_row(k, "-" if v is None else str(v))
    console.print(t)


@app.command("workloads")
def list_workloads(name: str = typer.Argument(None, help="show one workload's parameters")) -> None:
    """List the workloads, or one workload's parameters with their defaults and limits."""
    console = Console(markup=False, highlight=False)
    if name:
        console.print(param_table(workloads.get(name)))
        return
    t = Table(title="workloads", title_justify="left")
    t.add_column("name", style="bold")
    t.add_column("what it measures")
    t.add_column("multi-GPU")
    for w in workloads.all_workloads():
        t.add_row(w.name, w.summary, "yes" if w.multi_gpu else "-")
    console.print(t)


def options_table(title: str, params) -> Table:
    """Option, default, allowed values and meaning of a group of Params."""
    t = Table(title=title, title_justify="left")
    for col in ("option", "default", "allowed", "meaning"):
        t.add_column(col)
    for p in params:
        t.add_row(p.option, "-" if p.default in (None, "") else str(p.default), p.describe_allowed(), p.help)
    return t


def param_table(w) -> Table:
    """A workload's parameters."""
    return options_table(f"{w.name}: {w.summary}", w.params)
