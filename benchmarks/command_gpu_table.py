"""The markdown table of benchmarks/command_gpu.sh: a user's training script as a command, host against pod.

    python benchmarks/command_gpu_table.py DB COMMAND_EXPERIMENT CNN_EXPERIMENT yes|no|cpu
Beside it, gpuvs's own cnn-train of the same model on the host. yes: the script waits for the GPU every step."""

import json
import subprocess
import sys


def report(db: str, ident: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "gpuvs", "report", ident, "--format", "json", "--store", db],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"gpuvs report {ident}: {r.stderr.strip()}")
    return json.loads(r.stdout)


def headline(data: dict) -> str:
    return next(m["name"] for m in data["metrics"] if m["headline"])


def main() -> None:
    db, cmd_id, cnn_id, syncs = sys.argv[1:5]
    cmd, cnn = report(db, cmd_id), report(db, cnn_id)
    cm, nm = headline(cmd), headline(cnn)
    arms = {a["name"]: a for a in cmd["arms"]}
    cnn_arms = {a["name"]: a for a in cnn["arms"]}

    def cell(arm: dict | None, metric: str) -> str:
        s = (arm or {}).get("summaries", {}).get(metric)
        if not s:
            return "-"
        spread = f" [{s['min']:.1f}-{s['max']:.1f}]" if s.get("n", 0) > 1 else ""
        return f"{s['mean']:.1f}{spread} ({arm['n_ok']}/{arm['n_total']} trials)"

    print("| figure (images/sec, mean over trials [min-max]) | host | pod |")
    print("|---|---|---|")
    print(f"| the user's script as a command (`--step-metric {cm}`: mean of its per-step rates) | "
          f"{cell(arms.get('host'), cm)} | {cell(arms.get('pod'), cm)} |")
    print(f"| gpuvs cnn-train, same model and settings ({nm}) | {cell(cnn_arms.get('host'), nm)} | "
          f"{cell(cnn_arms.get('pod'), nm)} |")
    print()
    for v in cmd["verdicts"]:
        if v["metric"] == cm:
            print(f"- Verdict, the user's script: {v['arm']} vs {v['baseline']}: {v['ratio']:.4f}x "
                  f"({100 * v['confidence']:g}% CI {v['ci_low']:.4f}-{v['ci_high']:.4f}): **{v['verdict']}**")
    for where in ("host", "pod"):
        a = (arms.get(where) or {}).get("summaries", {}).get(cm)
        b = (cnn_arms.get(where) or {}).get("summaries", {}).get(nm)
        if a and b:
            ratio = a["mean"] / b["mean"]
            within = "within" if abs(ratio - 1) <= 0.03 else "NOT within"
            print(f"- {where}: the user's script / gpuvs cnn-train = {ratio:.4f} ({100 * (ratio - 1):+.2f}%): "
                  f"{within} the 3% target")
    wait = {"yes": "waits for the GPU after every step (torch.cuda.synchronize() before each clock reading), as the "
                   "recipe's loop does: on an H100 that costs about 2% against a loop that does not",
            "cpu": "ran on the CPU (the dry run: nothing to wait for; on a GPU it waits for the GPU after every step, "
                   "torch.cuda.synchronize() before each clock reading)"}.get(syncs, "does not wait for the GPU after "
                                                                                   "each step")
    print(f"- The user's script {wait}; gpuvs cnn-train times its steps with CUDA events and synchronises only at "
          "the ends of its timed loop.")


if __name__ == "__main__":
    main()
