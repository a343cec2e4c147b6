"""Makes tests/data/golden/golden.db by real runs of the command line, tiny and on the CPU, with fixed seeds.

    python tests/data/make_golden.py store      # run the experiments below into a new golden.db (minutes)
    python tests/data/make_golden.py outputs    # (re)write tests/data/golden/outputs/ from golden.db
"""

# The store is made once and committed: its figures are measured, so a new one differs in every number. The
# outputs are rewritten only where a change of output is meant (and the diff reviewed); tests/report/test_golden.py
# renders them again with the code under test and compares. The fleet and validate runs take the test cluster's
# lock. What the store holds (one experiment per name): runs (ok, failed with a retry, interrupted by a SIGKILL of
# gpuvs), comparisons (two arms, three arms --until-confident, an experiment file with a multi-series,
# multi-metric workload, an arm that always fails, 1 vs 2 CPU processes for the scaling table, an NLP
# workload's metric family), gpuvs share, advise-mps and share-matrix on the CPU, and, where the test
# cluster is up, a gpuvs fleet of its three nodes and a gpuvs validate run.

from __future__ import annotations

import fcntl
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))
import golden  # noqa: E402  (tests/golden.py)

CLUSTER_LOCK = "/tmp/gpuvs-cluster.lock"
KUBECONFIG = Path(os.environ.get("GPUVS_CLUSTER_DIR", "/tmp/gpuvs-cluster")) / "kubeconfig"
IMAGE = "localhost/gpuvs-python:test"  # the test cluster's image (tests/fleet/test_fleet_cluster.py)
SPIN = ["--device", "cpu", "--steps", "4", "--ops", "50000", "--warmup-steps", "1"]
SELFTEST = ["--device", "cpu", "--steps", "5", "--step-seconds", "0.004"]

EXPERIMENT_FILE = """\
name: golden-compare-file
description: two operand rotations of tiny CPU GEMMs (a multi-series, multi-metric workload)
workload: gemm
device: cpu
trials: 3
margin: 0.05
order_seed: 14
params:
  shape: 64x64x64,96x96x96
  repeats: 3
  warmup: 1
  block_ms: 1
arms:
  - name: one-buffer
    buffers: 1
  - name: two-buffers
    buffers: 2
"""

PAIRS_FILE = """\
name: golden-share-matrix
device: cpu
duration: 0.5
mps: "off"
pairs:
  - ["selftest --step-seconds 0.02", "spin --ops 200000"]
"""


def gpuvs(work: Path, *args: str, expect: int = 0) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), COLUMNS="160")
    print("$ gpuvs " + " ".join(args), flush=True)
    r = subprocess.run([sys.executable, "-m", "gpuvs", *args], cwd=work, env=env, capture_output=True, text=True,
                       timeout=1800)
    if r.returncode != expect:
        sys.exit(f"gpuvs {' '.join(args)}: exit status {r.returncode}, expected {expect}\n{r.stdout[-3000:]}\n"
                 f"{r.stderr[-3000:]}")


def store_args() -> list[str]:
    return ["--store", golden.STORE_NAME]


def interrupted(work: Path) -> None:
    """A run whose gpuvs is killed outright (SIGKILL) while its trial runs: the next gpuvs that opens the store
    marks the trial interrupted and keeps what it had measured."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.Popen([sys.executable, "-m", "gpuvs", "run", "selftest", "--device", "cpu", "--steps", "100000",
                             "--step-seconds", "0.02", "--name", "golden-interrupted", "--quiet", *store_args()],
                            cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    db = work / golden.STORE_NAME
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(0.5)
        try:
            con = sqlite3.connect(db, timeout=5)
            n = con.execute("SELECT COUNT(*) FROM samples s JOIN trials t ON t.id=s.trial_id JOIN experiments e "
                            "ON e.id=t.experiment_id WHERE e.name='golden-interrupted'").fetchone()[0]
            con.close()
        except sqlite3.Error:
            n = 0
        if n >= 20:
            break
    os.killpg(proc.pid, signal.SIGKILL)  # gpuvs and its worker, started here in their own session
    proc.wait()


def make_store() -> None:
    work = Path(os.environ.get("GOLDEN_WORK") or f"/tmp/gpuvs-golden-build-{os.getpid()}")
    work.mkdir(parents=True, exist_ok=False)
    s = store_args()
    gpuvs(work, "run", "spin", *SPIN, "--trials", "3", "--order-seed", "11", "--name", "golden-run-spin",
          "--quiet", *s)
    gpuvs(work, "run", "spin", *SPIN[:4], "--ops", "60000", "--warmup-steps", "1", "--trials", "3", "--order-seed",
          "12", "--name", "golden-run-spin-b", "--quiet", *s)
    gpuvs(work, "run", "selftest", "--device", "cpu", "--steps", "4", "--exit-at-step", "3", "--retries", "1",
          "--name", "golden-run-failing", "--quiet", *s, expect=1)
    interrupted(work)
    gpuvs(work, "compare", "selftest", *SELFTEST, "--arm", "fast:step_seconds=0.004", "--arm",
          "slow:step_seconds=0.008", "--trials", "3", "--order-seed", "13", "--name", "golden-compare-2arms",
          "--quiet", *s)
    gpuvs(work, "compare", "selftest", *SELFTEST, "--arm", "a:step_seconds=0.004", "--arm", "b:steps=6",
          "--arm", "c:step_seconds=0.006", "--until-confident", "--max-trials", "6", "--margin", "0.2",
          "--order-seed", "15", "--name", "golden-compare-until", "--quiet", *s)
    (work / "golden-compare.yaml").write_text(EXPERIMENT_FILE)
    gpuvs(work, "compare", "--file", "golden-compare.yaml", "--quiet", *s)
    gpuvs(work, "compare", "selftest", *SELFTEST, "--arm", "ok:steps=5", "--arm", "broken:fail_at_step=2",
          "--trials", "2", "--order-seed", "16", "--name", "golden-compare-failing-arm", "--quiet", *s, expect=1)
    gpuvs(work, "compare", "cnn-infer", "--device", "cpu", "--model", "resnet18", "--image-size", "32",
          "--batch-size", "2", "--steps", "4", "--warmup-steps", "1", "--num-classes", "10", "--arm",
          "one:num_gpus=1", "--arm", "two:num_gpus=2", "--trials", "2", "--order-seed", "17", "--name",
          "golden-compare-scaling", "--quiet", *s)
    gpuvs(work, "compare", "tc-train", "--device", "cpu", "--sentences", "60", "--d-model", "16", "--layers", "1",
          "--heads", "2", "--max-len", "16", "--batch-size", "8", "--epochs", "1", "--warmup-steps", "1",
          "--threads", "1", "--arm", "small:d_model=16", "--arm", "wide:d_model=64", "--trials", "3",
          "--order-seed", "18", "--name", "golden-compare-nlp", "--quiet", *s)
    gpuvs(work, "share", "selftest", "--device", "cpu", "--step-seconds", "0.02", "--workers", "1,2", "--duration",
          "1", "--repeats", "2", "--name", "golden-share", *s)
    gpuvs(work, "advise-mps", "selftest --step-seconds 0.02", "spin --ops 200000", "--device", "cpu", "--duration",
          "1", "--repeats", "2", "--name", "golden-advise", *s)
    (work / "golden-pairs.yaml").write_text(PAIRS_FILE)
    gpuvs(work, "share-matrix", "golden-pairs.yaml", "--device", "cpu", *s)
    if KUBECONFIG.exists():
        with open(CLUSTER_LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            gpuvs(work, "fleet", "spin", "--device", "cpu", "--steps", "4", "--ops", "300000", "--warmup-steps", "1",
                  "--image", IMAGE, "--image-pull-policy", "Never", "--kubeconfig", str(KUBECONFIG),
                  "--trials", "4", "--max-trials", "4", "--margin", "0.3", "--order-seed", "19",
                  "--name", "golden-fleet", *s)
            gpuvs(work, "validate", "--kubeconfig", str(KUBECONFIG), "--image", IMAGE, "--image-pull-policy", "Never",
                  "--timeout", "60", "--name", "golden-validate", *s)
    else:
        print(f"no test cluster ({KUBECONFIG} missing): no fleet and no validate experiment", file=sys.stderr)
    con = sqlite3.connect(work / golden.STORE_NAME)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.execute("PRAGMA journal_mode=DELETE")
    con.execute("VACUUM")
    con.close()
    golden.GOLDEN.mkdir(parents=True, exist_ok=True)
    (work / golden.STORE_NAME).replace(golden.STORE)
    print(f"wrote {golden.STORE} (build folder {work})")


def write_outputs() -> None:
    for old in golden.OUTPUTS.glob("*"):
        old.unlink()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    subprocess.run([sys.executable, str(HERE.parent / "golden.py"), "render", str(golden.STORE), str(golden.OUTPUTS)],
                   env=env, check=True)


if __name__ == "__main__":
    what = sys.argv[1:] or ["store", "outputs"]
    if "store" in what:
        make_store()
    if "outputs" in what:
        write_outputs()
