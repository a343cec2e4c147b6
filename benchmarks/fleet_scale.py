"""What a `gpuvs fleet` run costs the cluster as the fleet grows: API requests, etcd bytes and wall time per node.

    python benchmarks/fleet_scale.py [--sizes 4,8,16] [--trials 4] [--parallel 4] [--output fleet-scale.md]

It brings up a test cluster of its own (audit log on), runs `gpuvs fleet spin` per size, and projects to 1,000 nodes."""

from __future__ import annotations

import argparse
import base64
import collections
import http.client
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "test-cluster"
IMAGE = "localhost/gpuvs-python:test"
# this instance, unless the environment names another (never the shared test cluster: see main)
INSTANCE = {"GPUVS_CLUSTER_DIR": "/tmp/gpuvs-scale", "GPUVS_CLUSTER_NAME": "gscale",
            "GPUVS_CLUSTER_PORT_OFFSET": "20000", "GPUVS_CLUSTER_POD_NET": "10.245"}
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
- level: Metadata
"""
# What each run measures:
# - API requests, from the API server's audit log (every request at level Metadata): gpuvs's (its user, the
#   cluster's admin), by verb and resource, and those the scheduler and kubelets made about gpuvs's objects;
# - etcd: every write under /registry/, from a watch on etcd itself: gpuvs's objects' writes and bytes, the peak of
#   their live bytes, what is left after the run (events stay for the event TTL, 1 h), and etcd's own counters;
# - the command's wall time, and gpuvs's own CPU time.
# Then a fit per figure, y = a + b * nodes. Requests and bytes are counts, not the machine's; wall and CPU times are.
# The cluster comes down at the end (on failure, Ctrl-C, SIGTERM and SIGHUP too) unless --keep.
# gpuvs's objects in etcd: its trial pods, their events, the package ConfigMap
KINDS = {"pods": "/registry/pods/default/gpuvs-", "events": "/registry/events/default/gpuvs-",
         "package configmap": "/registry/configmaps/default/gpuvs-pkg-"}


def log(msg: str) -> None:
    print(f"fleet_scale: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------- etcd
def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class EtcdWatch(threading.Thread):
    """Every write under /registry/ while it runs, from etcd's own watch (its JSON gateway): counts and bytes of
    the values written, by kind of gpuvs object, and the live bytes of the gpuvs objects written meanwhile."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.port = port
        self.ready = threading.Event()
        self.stopping = False
        self.lock = threading.Lock()
        self.puts = collections.Counter()
        self.put_bytes = collections.Counter()
        self.deletes = collections.Counter()
        self.live: dict[str, int] = {}  # key -> bytes, gpuvs's objects written in this window
        self.peak_live = 0
        self.peak_live_by: dict[str, int] = {}
        self.peak_pods = 0
        self.package_keys: set[str] = set()  # the package ConfigMaps written
        self.pod_born: dict[str, float] = {}  # pod key -> when first written
        self.pod_seconds = 0.0  # the trial pods' lives in etcd, summed
        self.error: str | None = None

    @staticmethod
    def kind(key: str) -> str:
        return next((k for k, prefix in KINDS.items() if key.startswith(prefix)), "other (cluster)")

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # noqa: BLE001 - reported by the caller
            if not self.stopping:
                self.error = f"{type(exc).__name__}: {exc}"
            self.ready.set()

    def _run(self) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=None)
        self.conn.request("POST", "/v3/watch", json.dumps({"create_request": {"key": _b64("/registry/"),
                                                                              "range_end": _b64("/registry0")}}))
        resp = self.conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"etcd watch: HTTP {resp.status}")
        dec, buf = json.JSONDecoder(), ""
        while not self.stopping:
            chunk = resp.read1(65536).decode()
            if not chunk:
                break
            buf += chunk
            while True:
                buf = buf.lstrip()
                try:
                    obj, end = dec.raw_decode(buf)
                except ValueError:
                    break
                buf = buf[end:]
                result = obj.get("result", {})
                if result.get("created"):
                    self.ready.set()
                for ev in result.get("events", []):
                    self._event(ev)

    def _event(self, ev: dict) -> None:
        kv = ev["kv"]
        key = base64.b64decode(kv["key"]).decode(errors="replace")
        kind = self.kind(key)
        with self.lock:
            if ev.get("type") == "DELETE":
                self.deletes[kind] += 1
                self.live.pop(key, None)
                if key in self.pod_born:
                    self.pod_seconds += time.monotonic() - self.pod_born.pop(key)
            else:
                size = len(base64.b64decode(kv.get("value", "")))
                self.puts[kind] += 1
                self.put_bytes[kind] += size
                if kind != "other (cluster)":
                    self.live[key] = size
                if kind == "package configmap":
                    self.package_keys.add(key)
                if kind == "pods":
                    self.pod_born.setdefault(key, time.monotonic())
            now = sum(self.live.values())
            if now > self.peak_live:
                self.peak_live = now
                self.peak_live_by = {k: sum(v for key_, v in self.live.items() if self.kind(key_) == k) for k in KINDS}
            self.peak_pods = max(self.peak_pods, sum(1 for k in self.live if k.startswith(KINDS["pods"])))

    def stop(self) -> None:
        self.stopping = True
        try:
            self.conn.sock.shutdown(2)
        except Exception as exc:  # noqa: BLE001 - closed already
            log(f"etcd watch: {exc}")
        self.join(5)


def etcd_metrics(port: int) -> dict[str, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics")
    out = {}
    for line in conn.getresponse().read().decode().splitlines():
        if line and not line.startswith("#") and " " in line:
            name, value = line.rsplit(" ", 1)
            try:
                out[name] = float(value)
            except ValueError:
                pass
    return out


ETCD_FIGURES = {"put_bytes": "etcd_debugging_mvcc_total_put_size_in_bytes", "puts": "etcd_mvcc_put_total",
                "db_bytes": "etcd_mvcc_db_total_size_in_bytes", "wal_bytes": "etcd_disk_wal_write_bytes_total"}


# ---------------------------------------------------------------------------------------------------- audit log
def audit_counts(path: Path, offset: int, trials: int) -> dict:
    """The audit log's requests after `offset`: gpuvs's (user admin) by verb and resource, and those other
    users made about gpuvs's objects."""
    ours, about, everyone = collections.Counter(), collections.Counter(), 0
    with open(path, "rb") as f:
        f.seek(offset)
        for line in f:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            everyone += 1
            user = e["user"]["username"]
            ref = e.get("objectRef") or {}
            what = ref.get("resource") or e["requestURI"].split("?")[0]
            if ref.get("subresource"):
                what += "/" + ref["subresource"]
            verb = e["verb"] + (" (dry run)" if "dryRun=" in e["requestURI"] else "")
            if user == "admin":
                ours[f"{verb} {what}"] += 1
            elif "gpuvs-" in e["requestURI"] or (ref.get("name") or "").startswith("gpuvs-"):
                who = "kubelet" if user.startswith("system:node:") else user.removeprefix("system:")
                about[f"{who}: {verb} {what}"] += 1
    return {"gpuvs": dict(sorted(ours.items())), "gpuvs_total": sum(ours.values()),
            "components": dict(sorted(about.items())), "components_total": sum(about.values()),
            "all_users_total": everyone, "trials": trials}


# ---------------------------------------------------------------------------------------------------- a run
@dataclass
class Run:
    nodes: int
    steps: int = 0
    trials: int = 0
    wall_s: float = 0.0
    gpuvs_cpu_s: float = 0.0
    exit: int = 0
    requests: dict = field(default_factory=dict)
    etcd_writes: dict = field(default_factory=dict)  # kind -> [puts, bytes, deletes]
    peak_live_bytes: int = 0
    peak_live_by: dict = field(default_factory=dict)
    peak_pods: int = 0
    left_bytes: dict = field(default_factory=dict)  # kind -> live bytes of this run's objects after it
    etcd_metrics: dict = field(default_factory=dict)  # name -> [before, after]
    package_configmaps: int = 0
    pod_seconds: float = 0.0  # the trial pods' lives (created to deleted), summed


def fleet(env: dict, state: Path, nodes: list[str], args, steps: int, store: Path, out: Path
          ) -> tuple[int, float, float, int]:
    spin = ["--device", "cpu", "--steps", str(steps), "--ops", str(args.ops), "--warmup-steps", "1"]
    cmd = [sys.executable, "-m", "gpuvs", "fleet", "spin", *spin, "--image", IMAGE, "--image-pull-policy", "Never",
           "--kubeconfig", str(state / "kubeconfig"), "--nodes", ",".join(nodes), "--trials", str(args.trials),
           "--max-trials", str(args.trials), "--parallel", str(args.parallel), "--margin", "0.3",
           "--store", str(store), "--format", "json", "--output", str(out)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, err = p.communicate(timeout=args.run_timeout)
    except BaseException:  # Ctrl-C, SIGTERM, the timeout: gpuvs deletes its pods on SIGTERM
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
        raise
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode not in (0, 1):
        raise RuntimeError(f"gpuvs fleet exited {p.returncode}: {err.strip()[-2000:]}")
    trials = 0
    if out.exists():
        rows = json.loads(out.read_text()).get("rows", [])
        trials = sum(int(r.get("n_trials") or 0) for r in rows)
    return p.returncode, wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime), trials


def measure(n: int, env: dict, state: Path, etcd_port: int, args, work: Path, steps: int) -> Run:
    names = [f"{env['GPUVS_CLUSTER_NAME']}-node-{i}" for i in range(1, n + 1)]
    audit = state / "logs" / "audit.log"
    time.sleep(args.settle)
    watch = EtcdWatch(etcd_port)
    watch.start()
    if not watch.ready.wait(15) or watch.error:
        raise RuntimeError(f"etcd's watch did not start: {watch.error}")
    m0 = etcd_metrics(etcd_port)
    offset = audit.stat().st_size
    run = Run(nodes=n, steps=steps)
    try:
        run.exit, run.wall_s, run.gpuvs_cpu_s, run.trials = fleet(env, state, names, args, steps,
                                                                 work / f"fleet-{n}-{steps}.db",
                                                                 work / f"fleet-{n}-{steps}.json")
        time.sleep(3)  # the last watches' audit events, the last deletes in etcd
    finally:
        watch.stop()
    m1 = etcd_metrics(etcd_port)
    run.requests = audit_counts(audit, offset, run.trials)
    run.etcd_writes = {k: [watch.puts[k], watch.put_bytes[k], watch.deletes[k]]
                       for k in [*KINDS, "other (cluster)"]}
    run.peak_live_bytes, run.peak_live_by, run.peak_pods = watch.peak_live, watch.peak_live_by, watch.peak_pods
    run.left_bytes = {k: sum(v for key, v in watch.live.items() if watch.kind(key) == k) for k in KINDS}
    run.etcd_metrics = {k: [m0.get(name, 0.0), m1.get(name, 0.0)] for k, name in ETCD_FIGURES.items()}
    run.package_configmaps = len(watch.package_keys)
    run.pod_seconds = watch.pod_seconds
    return run


# ---------------------------------------------------------------------------------------------------- fit, table
def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b x."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


def figures(r: Run) -> dict[str, float]:
    w = r.etcd_writes
    gpuvs_bytes = sum(w[k][1] for k in KINDS)
    return {
        "trials": r.trials,
        "package ConfigMaps written": r.package_configmaps,
        "pod life, s (summed over trials)": r.pod_seconds,
        "wall time, s": r.wall_s,
        "gpuvs CPU time, s": r.gpuvs_cpu_s,
        "API requests by gpuvs": r.requests["gpuvs_total"],
        "API requests by the cluster about gpuvs's objects": r.requests["components_total"],
        "etcd writes of gpuvs's objects": sum(w[k][0] + w[k][2] for k in KINDS),
        "etcd bytes written, gpuvs's objects": gpuvs_bytes,
        "  of which the package ConfigMap": w["package configmap"][1],
        "  of which pods": w["pods"][1],
        "  of which events": w["events"][1],
        "etcd peak live bytes of gpuvs's objects": r.peak_live_bytes,
        "etcd bytes left after the run (events, 1 h TTL)": sum(r.left_bytes.values()),
    }


def fmt(v: float, key: str) -> str:
    if "bytes" in key or key.strip().startswith("of which"):
        return f"{v / 1e6:.2f} MB" if abs(v) >= 1e6 else f"{v / 1e3:.1f} kB"
    if float(v).is_integer():
        return f"{v:,.0f}"
    if key.endswith(", s"):
        return f"{v:.1f}" if abs(v) < 1000 else f"{v:,.0f}"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.1f}"


def table(runs: list[Run], args, command: str, longer: Run | None = None) -> str:
    rows = [figures(r) for r in runs]
    sizes = [r.nodes for r in runs]
    out = [f"`{command}`", "",
           f"`gpuvs fleet spin` ({args.steps} steps of {args.ops:,} operations), {args.trials} trials per node (`--max-trials "
           f"{args.trials}`), `--parallel {args.parallel}`; nodes of the test cluster (Kubernetes 1.20, one fake GPU "
           "each). Requests and bytes are counts; times are on this machine.", ""]
    head = "| figure | " + " | ".join(f"{n} nodes" for n in sizes) + " | per node (fit) | fixed (fit) | 1,000 nodes |"
    out += [head, "| --- |" + " ---: |" * (len(sizes) + 3)]
    xs = [float(n) for n in sizes]
    for key in rows[0]:
        ys = [float(row[key]) for row in rows]
        a, b = fit(xs, ys)
        proj = a + 1000 * b
        out.append(f"| {key} | " + " | ".join(fmt(y, key) for y in ys) +
                   f" | {fmt(b, key)} | {fmt(a, key)} | {fmt(proj, key)} |")
    if longer is not None:
        short = next(r for r in runs if r.nodes == longer.nodes)
        out += ["", f"Longer trials ({longer.nodes} nodes, {short.steps} against {longer.steps} steps of spin): "
                "what a trial's length adds, per trial", "",
                "| trial | pod life, s | API requests by gpuvs | by the cluster about its objects | "
                "etcd bytes of pods and events |", "| --- | ---: | ---: | ---: | ---: |"]
        for r in (short, longer):
            t = max(r.trials, 1)
            out.append(f"| {r.steps} steps | {r.pod_seconds / t:.1f} | {r.requests['gpuvs_total'] / t:.1f} | "
                       f"{r.requests['components_total'] / t:.1f} | "
                       f"{fmt((r.etcd_writes['pods'][1] + r.etcd_writes['events'][1]) / t, 'bytes')} |")
        ds = longer.pod_seconds / max(longer.trials, 1) - short.pod_seconds / max(short.trials, 1)
        if ds > 0:
            per_s = (longer.requests["gpuvs_total"] / max(longer.trials, 1)
                     - short.requests["gpuvs_total"] / max(short.trials, 1)) / ds
            out += ["", f"Each second a trial's pod lives adds {per_s:.2f} API requests by gpuvs."]
    out += ["", "gpuvs's requests by verb and resource, per trial (largest run):", ""]
    big = runs[-1]
    out += ["| request | count | per trial |", "| --- | ---: | ---: |"]
    for k, v in sorted(big.requests["gpuvs"].items(), key=lambda kv: -kv[1]):
        out.append(f"| {k} | {v} | {v / max(big.trials, 1):.2f} |")
    out += ["", "The cluster's requests about gpuvs's objects (largest run):", ""]
    out += ["| request | count | per trial |", "| --- | ---: | ---: |"]
    for k, v in sorted(big.requests["components"].items(), key=lambda kv: -kv[1]):
        out.append(f"| {k} | {v} | {v / max(big.trials, 1):.2f} |")
    out += ["", "etcd's own counters over each run (every writer: the kubelets' node status and leases included):",
            "", "| nodes | put bytes (all) | puts (all) | db size before → after | peak live pods | "
            "API requests, all users |", "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in runs:
        m = r.etcd_metrics
        out.append(f"| {r.nodes} | {fmt(m['put_bytes'][1] - m['put_bytes'][0], 'bytes')} | "
                   f"{m['puts'][1] - m['puts'][0]:.0f} | {fmt(m['db_bytes'][0], 'bytes')} → "
                   f"{fmt(m['db_bytes'][1], 'bytes')} | {r.peak_pods} | {r.requests['all_users_total']} |")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------------- cluster
def cluster(cmd: list[str], env: dict, timeout: float = 600) -> None:
    r = subprocess.run([sys.executable, str(SCRIPT), *cmd], env=env, timeout=timeout, capture_output=True, text=True,
                       check=False)
    if r.returncode != 0:
        raise RuntimeError(f"test-cluster {' '.join(cmd)}: {(r.stdout + r.stderr).strip()[-1500:]}")
    log((r.stdout + r.stderr).strip().splitlines()[-1] if (r.stdout + r.stderr).strip() else f"{cmd[0]} done")


def _raise(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="4,8,16", help="fleet sizes, comma-separated (the cluster has the largest)")
    ap.add_argument("--cluster-nodes", type=int, help="nodes of the cluster (default: the largest size)")
    ap.add_argument("--trials", type=int, default=4, help="trials per node (no extra ones: --max-trials the same)")
    ap.add_argument("--parallel", type=int, default=4, help="gpuvs fleet --parallel, the same for every size")
    ap.add_argument("--steps", type=int, default=4, help="spin's steps per trial")
    ap.add_argument("--ops", type=int, default=300000, help="spin's operations per step")
    ap.add_argument("--long-steps", type=int, default=20,
                    help="one more run at the smallest size with trials of this many steps: what a longer trial "
                         "adds (0: none)")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds of quiet before each run")
    ap.add_argument("--run-timeout", type=float, default=900.0)
    ap.add_argument("--output", help="write the markdown here too")
    ap.add_argument("--json", help="write every figure as JSON here")
    ap.add_argument("--keep", action="store_true", help="leave the cluster up at the end")
    args = ap.parse_args()
    try:
        sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    except ValueError:
        print(f"fleet_scale: --sizes {args.sizes!r}: give node counts, e.g. 4,8,16", file=sys.stderr)
        return 2
    if not sizes or sizes[0] < 2 or args.trials < 4 or args.parallel < 1:
        print("fleet_scale: sizes must be 2 nodes or more, --trials 4 or more, --parallel 1 or more", file=sys.stderr)
        return 2
    env = {**os.environ, **{k: os.environ.get(k, v) for k, v in INSTANCE.items()}}
    state = Path(env["GPUVS_CLUSTER_DIR"]).resolve()
    if state == Path("/tmp/gpuvs-cluster") or env["GPUVS_CLUSTER_PORT_OFFSET"] in ("", "0"):
        print("fleet_scale: this brings its own cluster up and down: give it its own GPUVS_CLUSTER_DIR and "
              "GPUVS_CLUSTER_PORT_OFFSET, not the shared test cluster's", file=sys.stderr)
        return 2
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.pop("KUBECONFIG", None)
    work = Path(tempfile.mkdtemp(prefix="fleet-scale-"))
    policy = work / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY)
    env["GPUVS_CLUSTER_AUDIT_POLICY"] = str(policy)
    # images of its own (links to the shared cache's): a test image rebuilt here never replaces the shared one
    shared = Path(os.environ.get("GPUVS_K8S_CACHE", "/var/cache/gpuvs-k8s"))
    cache = work / "k8s-cache"
    (cache / "images").mkdir(parents=True)
    (cache / "bin").symlink_to(shared / "bin")
    for tar in (shared / "images").glob("*.tar"):
        (cache / "images" / tar.name).symlink_to(tar)
    env["GPUVS_K8S_CACHE"] = str(cache)
    size = max(args.cluster_nodes or 0, sizes[-1])
    etcd_port = 2379 + int(env["GPUVS_CLUSTER_PORT_OFFSET"])
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise)
    command = "python benchmarks/fleet_scale.py " + " ".join(sys.argv[1:])
    runs: list[Run] = []
    longer: Run | None = None
    up_failed = False
    try:
        log(f"up: {size} nodes in {state}")
        t0 = time.monotonic()
        try:
            cluster(["up", "--nodes", str(size), "--gpus", "1"], env)
        except RuntimeError:  # test-cluster stopped what it had started (or started nothing: a cluster already there)
            up_failed = True
            raise
        log(f"cluster up in {time.monotonic() - t0:.0f} s")
        if not (state / "logs" / "audit.log").exists():
            raise RuntimeError(f"no audit log in {state / 'logs'}: the cluster was already up without one "
                               "(`down` it with the same settings first)")
        for n in sizes:
            log(f"fleet over {n} nodes")
            run = measure(n, env, state, etcd_port, args, work, args.steps)
            log(f"{n} nodes: {run.trials} trials in {run.wall_s:.0f} s, {run.requests['gpuvs_total']} requests by "
                f"gpuvs, {run.package_configmaps} package ConfigMap(s)")
            runs.append(run)
        if args.long_steps:
            log(f"fleet over {sizes[0]} nodes, trials of {args.long_steps} steps")
            longer = measure(sizes[0], env, state, etcd_port, args, work, args.long_steps)
            log(f"{sizes[0]} nodes, longer trials: {longer.trials} trials in {longer.wall_s:.0f} s, "
                f"{longer.requests['gpuvs_total']} requests by gpuvs")
    except KeyboardInterrupt:
        log("interrupted: bringing the cluster down")
        return_code = 130
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        log(f"failed: {exc}" + ("" if up_failed or args.keep else "; bringing the cluster down"))
        return_code = 1
    else:
        return_code = 0
    finally:
        if not args.keep and not up_failed:
            try:
                cluster(["down"], {**env, "GPUVS_CLUSTER_AUDIT_POLICY": ""}, timeout=300)
            except Exception as exc:  # noqa: BLE001
                log(f"down failed: {exc}")
                return_code = 1
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if runs:
        md = table(runs, args, command, longer)
        print(md)
        if args.output:
            Path(args.output).write_text(md)
        if args.json:
            Path(args.json).write_text(json.dumps([asdict(r) for r in runs + ([longer] if longer else [])], indent=1))
    return return_code


if __name__ == "__main__":
    sys.exit(main())
