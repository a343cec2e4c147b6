"""Tables of the GPU cluster kit (benchmarks/gpu_cluster.sh), from its store:

    python benchmarks/gpu_cluster_tables.py ids DB              experiment ids, oldest first (one a line)
    python benchmarks/gpu_cluster_tables.py nodes DB ID         a fleet run's nodes: GPU (UUID as NVML reads it in
                                                                the pod, and as the device plugin handed it), verdict,
                                                                and which fingerprint fields differ between nodes
    python benchmarks/gpu_cluster_tables.py runs DB RUNS.tsv    every fleet run of the kit: workload, co-tenant, wall
                                                                time, nodes called slower / equivalent / inconclusive

RUNS.tsv (written by the kit, one line per fleet run): experiment id, workload, co-tenant node (- for none), what the
co-tenant is (its GPU's UUID and name), the command's wall time in seconds."""

from __future__ import annotations

import sys
from pathlib import Path

from gpuvs.errors import UsageError
from gpuvs.fleet import fingerprints
from gpuvs.fleet.run import FleetResult
from gpuvs.report import markdown
from gpuvs.store.db import Store

# the fields a GPU's own identity fills: expected to differ from node to node
IDENTITY = ("GPU UUID (NVML in the pod)", "CUDA_VISIBLE_DEVICES (device plugin)")


def fleet_result(st: Store, exp_id: str) -> FleetResult | None:
    """The stored fleet result; None where the run stored none (stopped before its end, or never started)."""
    try:
        data = st.experiment(exp_id).meta.fleet
    except UsageError:
        return None
    return FleetResult.from_dict(data) if data else None


def _uuid(fp: dict) -> str | None:
    return fingerprints.get(fp, "gpus.0.uuid")


def nodes(st: Store, exp_id: str) -> str:
    res = fleet_result(st, exp_id)
    if res is None:
        return f"(experiment {exp_id} holds no fleet result: the run was stopped before it ended)\n"
    rows = [r for r in res.rows if r.fingerprint]
    fps = {r.node: r.fingerprint for r in rows}
    table = ["| node | verdict | speed vs fleet [interval] | GPU UUID (NVML in the pod) | CUDA_VISIBLE_DEVICES |",
             "|---|---|---|---|---|"]
    for r in res.rows:
        speed = (f"{r.speed:.3f} [{r.speed_low:.3f}-{r.speed_high:.3f}]"
                 if None not in (r.speed, r.speed_low, r.speed_high) else "-")
        table.append(f"| {markdown.cell(r.node)} | {markdown.cell(r.verdict)} | {speed} | "
                     f"{markdown.cell(_uuid(r.fingerprint) or '-')} | "
                     f"{markdown.cell(r.fingerprint.get('cuda_visible_devices') or '-')} |")
    out = "\n".join(table) + "\n"
    if len(fps) < 2:
        return out + "\n(fewer than two nodes with a fingerprint: nothing to compare)\n"
    identity = {IDENTITY[0]: [_uuid(fp) for fp in fps.values()],
                IDENTITY[1]: [fp.get("cuda_visible_devices") for fp in fps.values()]}
    differ = [label for label, values in identity.items() if len({repr(v) for v in values}) > 1]
    differ += [label for label, _, d in fingerprints.rows(fps) if d]
    others = [label for label in differ if label not in IDENTITY]
    same_gpu = [label for label in IDENTITY if label in identity and label not in differ
                and any(v is not None for v in identity[label])]
    out += (f"\nFingerprint fields that differ between the {len(fps)} nodes: "
            f"{', '.join(differ) or 'none'}. ")
    out += ("Besides the GPU's own identity: " + (", ".join(others) if others else "nothing") + ".")
    if same_gpu:
        out += f" Every node read the same {' and '.join(same_gpu)}: the nodes do not see distinct GPUs."
    return out + "\n"


def runs(st: Store, runs_tsv: Path) -> str:
    table = ["| workload | co-tenant (outside Kubernetes) | wall time of the run | slower | equivalent | "
             "other verdicts |", "|---|---|---|---|---|---|"]
    for line in runs_tsv.read_text().splitlines() if runs_tsv.exists() else []:
        exp_id, workload, node, uuid, wall = (line.split("\t") + [""] * 5)[:5]
        res = fleet_result(st, exp_id) if exp_id else None
        if res is None:
            verdicts = ["(no result)", "", ""]
        else:
            def named(rows):
                return ", ".join(f"{r.node} {r.speed:.3f}" + (f" [{r.speed_low:.3f}-{r.speed_high:.3f}]"
                                                                if r.speed_low is not None else "")
                                 if r.speed is not None else r.node for r in rows) or "none"
            slower = [r for r in res.rows if r.verdict == "slower"]
            same = [r for r in res.rows if r.verdict == "equivalent"]
            rest = [f"{r.node} {r.verdict}" for r in res.rows if r.verdict not in ("slower", "equivalent")]
            verdicts = [named(slower), named(same), ", ".join(rest) or "none"]
        cotenant = "none" if node in ("", "-") else f"{node}: {uuid}"
        table.append(f"| {markdown.cell(workload)} | {markdown.cell(cotenant)} | {wall} s | "
                     + " | ".join(markdown.cell(v) for v in verdicts) + " |")
    return "\n".join(table) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("ids", "nodes", "runs") or (argv[0] != "ids" and len(argv) != 3):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    db = Path(argv[1])
    if not db.exists():
        print(f"gpu_cluster_tables: no store {db}", file=sys.stderr)
        return 2 if argv[0] != "ids" else 0
    with Store(db) as st:
        if argv[0] == "ids":
            sys.stdout.write("".join(e.id + "\n" for e in st.experiments()))
        elif argv[0] == "nodes":
            sys.stdout.write(nodes(st, argv[2]))
        else:
            sys.stdout.write(runs(st, Path(argv[2])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
