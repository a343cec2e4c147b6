"""What a machine is, as tables: gpuvs info's fingerprint and gpuvs doctor's checks."""

from __future__ import annotations

from typing import Any

from gpuvs.report.fit import Table

from gpuvs.probes import checkup
from gpuvs.safetext import safe_text


def fingerprint_table(fp: dict[str, Any]) -> Table:
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
    return t


def checkup_table(report: checkup.Report, title: str) -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("check", "status", "detail"):
        t.add_column(col, overflow="fold")
    for row in report.rows:
        t.add_row(row.check, row.status, safe_text(row.detail),  # an engine's or a pod's words
                  style={checkup.FAIL: "red", checkup.WARN: "yellow"}.get(row.status))
    return t
