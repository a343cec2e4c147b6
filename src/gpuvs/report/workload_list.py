"""gpuvs workloads' table: what can be run."""

from __future__ import annotations

from gpuvs.report.fit import Table

from gpuvs.workloads import Workload


def workloads_table(found: list[Workload]) -> Table:
    t = Table(title="workloads", title_justify="left")
    t.add_column("name", style="bold")
    t.add_column("what it measures")
    t.add_column("multi-GPU")
    for w in found:
        t.add_row(w.name, w.summary, "yes" if w.multi_gpu else "-")
    return t
