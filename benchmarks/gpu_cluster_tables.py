"""Tables of the GPU cluster kit (benchmarks/gpu_cluster.sh), from its store: each table is a function below.

    python benchmarks/gpu_cluster_tables.py ids DB | nodes DB ID | check DB REF.json
    python benchmarks/gpu_cluster_tables.py runs DB RUNS.tsv | power DB RUNS.tsv
    (RUNS.tsv: the kit's, one line per fleet run; REF.json: benchmarks/gpu_check_ref.py --json)"""

from __future__ import annotations

import sys
from pathlib import Path

from gpuvs.errors import UsageError
from gpuvs.fleet.assess import fingerprint_diff as fingerprints
from gpuvs.fleet.result import FleetResult
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
    """A fleet run's nodes: GPU (NVML's UUID in the pod, and the device plugin's), verdict, differing fingerprints."""
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
    """Every fleet run of the kit: workload, co-tenant, wall time, nodes called slower / equivalent / inconclusive."""
    # RUNS.tsv, a line per fleet run: experiment id, workload, co-tenant node (- for none), the co-tenant's GPU UUID
    # and name, the command's wall time in seconds, the co-tenant's share busy (- for none; absent in earlier kits)
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


FOUND = ("slower", "slower-within-margin")


def slowed(res: FleetResult, node: str, uuid: str) -> list:
    """The rows the co-tenant slowed: the GPU whose UUID it ran on (a per-GPU run); else every row of its node (a
    run of nodes, or a CPU dry run, where the co-tenant is a quota on the whole node)."""
    own = [r for r in res.measured() if r.uuid and r.uuid == uuid]
    return own or [r for r in res.measured() if r.node == node]


def unit_name(r) -> str:
    return r.node if r.gpu is None else f"{r.node} GPU {r.gpu}"


def power(st: Store, runs_tsv: Path) -> str:
    """Per co-tenant share: how often the slowed GPU (or node) was found and a healthy one flagged, and its cause."""
    by_share: dict[str, list] = {}
    for line in runs_tsv.read_text().splitlines() if runs_tsv.exists() else []:
        exp_id, workload, node, what, wall, share = (line.split("\t") + [""] * 6)[:6]
        if share in ("", "-"):
            continue
        res = fleet_result(st, exp_id) if exp_id else None
        by_share.setdefault(share, []).append((workload, node, what.split(" ")[0], res))
    table = ["| co-tenant busy | fleet runs | slowed GPU found (slower or within margin) | its speed vs the fleet, "
             "each run | healthy GPUs called slower | healthy within the margin | the slowed GPU's cause row |",
             "|---:|---:|---|---|---|---|---|"]
    for share in sorted(by_share, key=float):
        rows = by_share[share]
        done = [(n, u, res) for _, n, u, res in rows if res is not None]
        found = healthy = flagged = within = 0
        speeds, whys = [], []
        for node, uuid, res in done:
            hit = slowed(res, node, uuid)
            found += any(r.verdict in FOUND for r in hit)
            speeds += [f"{unit_name(r)} {r.speed:.3f} {r.verdict}" if r.speed is not None else unit_name(r) for r in hit]
            whys += ["; ".join(r.why) or "no cause visible in NVML's readings" for r in hit]
            rest = [r for r in res.measured() if r not in hit]
            healthy += len(rest)
            flagged += sum(r.verdict == "slower" for r in rest)
            within += sum(r.verdict == "slower-within-margin" for r in rest)
        table.append(f"| {share} | {len(done)} of {len(rows)} | {found} of {len(done)} | "
                     f"{markdown.cell(', '.join(speeds) or '-')} | {flagged} of {healthy} | {within} of {healthy} | "
                     f"{markdown.cell(' / '.join(dict.fromkeys(whys)) or '-')} |")
    return "\n".join(table) + "\n"


# gpu-check's series, torch's reference for each (benchmarks/gpu_check_ref.py) and how far the pod may be from the
# same check on the host: the same program on the same GPU, so within its own run-to-run spread (launch latency,
# a few microseconds, moves most)
CHECK_ROWS = (("fp32_fma", "fp32_matmul_tflops", 0.02), ("fp16_mma", "fp16_matmul_tflops", 0.02),
              ("d2d_copy", "d2d_copy_gbps", 0.02), ("h2d_pinned", "h2d_pinned_gbps", 0.03),
              ("d2h_pinned", "d2h_pinned_gbps", 0.03), ("launch", "launch_us", 0.15))


def check(st: Store, ref_json: Path) -> str:
    """gpu-check in the kit's pod (the store's last) against the host's and torch's references, and what it loaded."""
    import json
    import statistics

    done = [t for t in st.trials(status="ok") if t.workload == "gpu-check"]
    if not done:
        return "\n(No gpu-check trial finished in the pod: see the report above and gpu_cluster.log.)\n"
    exp = done[-1].experiment_id
    trials = [t for t in done if t.experiment_id == exp]
    host = json.loads(ref_json.read_text()) if ref_json.exists() else None
    out = ["", f"gpu-check in the pod ({len(trials)} trials of experiment {exp}) against gpu-check run on the host and "
           "torch's references, in the same call (benchmarks/gpu_check_ref.py):", "",
           "| figure | in the pod | on the host | pod / host | tolerance | torch | pod / torch |", "|---|---|---|---|---|---|---|"]
    met = True
    for series, ref_key, tol in CHECK_ROWS:
        vals = [t.summary[series].value for t in trials if series in t.summary and t.summary[series].value]
        if not vals:
            out.append(f"| {series} | not measured | | | | | |")
            continue
        pod = statistics.fmean(vals)
        unit = trials[0].summary[series].unit
        h = (host or {}).get("check", {}).get("figures", {}).get(series, {}).get("value")
        r = (host or {}).get("reference", {}).get(ref_key)
        within = h is not None and abs(pod / h - 1) <= tol
        met &= within
        out.append(f"| {series} | {pod:.4g} {unit} | {f'{h:.4g}' if h else '-'} | "
                   f"{f'{pod / h:.3f}' if h else '-'} | ±{tol:.0%} {'met' if within else 'NOT MET'} | "
                   f"{f'{r:.4g}' if r else '-'} | {f'{pod / r:.3f}' if r else '-'} |")
    cfg = trials[0].config
    out += ["", f"The pod's own process: the driver's libraries mapped: {cfg.get('driver_libraries_mapped', '?')}; "
            f"other GPU libraries mapped: {cfg.get('other_gpu_libraries_mapped', '?')}; GPU packages imported: "
            f"{cfg.get('gpu_packages_imported', '?')} (gpu-check's configuration items, read from /proc/self/maps and "
            "sys.modules in the pod). " + ("Every figure within its tolerance of the host's." if met else
                                            "NOT every figure within its tolerance of the host's.")]
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("ids", "nodes", "runs", "power", "check") or (argv[0] != "ids" and len(argv) != 3):
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
        elif argv[0] == "check":
            sys.stdout.write(check(st, Path(argv[2])))
        elif argv[0] == "power":
            sys.stdout.write(power(st, Path(argv[2])))
        else:
            sys.stdout.write(runs(st, Path(argv[2])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
