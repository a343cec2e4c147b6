"""The GPU cluster kit (benchmarks/gpu_cluster.sh and its helpers) on a machine without a GPU.

Bad input is one line before anything starts; the co-tenant's loop runs on the CPU and stops on SIGTERM or by itself.
The kit's tables come from a real store.
A DEVICE=cpu dry run stopped by SIGTERM mid-fleet leaves nothing; its cluster runs beside the test cluster."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster import k8s_build  # noqa: F401  (a session fixture)

from conftest import ROOT, gpuvs_env, missing_part
from gpuvs.fleet.execute.adaptive import AdaptiveTrials
from gpuvs.fleet.result import FleetResult, NodeRow
from gpuvs.fleet.assess.node_verdicts import ErrorControl
from gpuvs.store.records import ExperimentMeta
from gpuvs.store.db import Store

KIT = ROOT / "benchmarks" / "gpu_cluster.sh"
COTENANT = ROOT / "benchmarks" / "gpu_cotenant.py"
TABLES = ROOT / "benchmarks" / "gpu_cluster_tables.py"
PREPARE = ROOT / "benchmarks" / "gpu_cluster_prepare.py"


def kit(env: dict, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(KIT)], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("env, said", [
    ({"DEVICE": "gpu"}, "DEVICE=gpu: allowed cuda, cpu"),
    ({"DEVICE": "cpu", "NODES": "0"}, "NODES=0: one kubelet at least (DEVICE=cuda: none without a GPU nvidia-smi lists)"),
    ({"DEVICE": "cpu", "NODES": "two"}, "NODES=two: a whole number"),
    ({"DEVICE": "cpu", "PARTS": "validate,bogus"}, "PARTS: bogus? allowed validate, fleet, power, check, scaling, command, nodes, pairs"),
    ({"DEVICE": "cpu", "NODES": "3", "PAIR_SLOW": "4"}, "PAIR_SLOW=4: a node's index, 1 to 3, or 0 (no co-tenant)"),
    ({"DEVICE": "cpu", "PAIR_PARALLEL": "0"}, "PAIR_PARALLEL=0: one pair at a time at least"),
    ({"DEVICE": "cpu", "NODES": "3", "NODE_COUNTS": "2 4"}, "NODE_COUNTS: 4? each 2 to NODES (3)"),
    ({"DEVICE": "cpu", "FLEET": "spin resnet"}, "FLEET: resnet? allowed cnn-train, gemm, spin"),
    ({"DEVICE": "cpu", "NODES": "3", "SLOW_NODE": "4"}, "SLOW_NODE=4: a node's index, 1 to 3"),
    ({"DEVICE": "cpu", "TOTAL_S": "9m"}, "TOTAL_S=9m: a whole number"),
    ({"DEVICE": "cpu", "KIT_NAME": "Gpu_Kit"}, "KIT_NAME=Gpu_Kit: lower-case letters and digits"),
    ({"DEVICE": "cpu", "COTENANT_BUSY": "5%"}, "COTENANT_BUSY=5%: a share above 0, at most 1"),
    ({"DEVICE": "cpu", "COTENANT_SIZE": "big"}, "COTENANT_SIZE=big: a whole number"),
    ({"DEVICE": "cuda", "NODES": "2", "FAKE_GPUS": "1"}, "FAKE_GPUS=1 applies to DEVICE=cpu (a machine without GPUs)"),
])
def test_bad_input_is_one_line_and_starts_nothing(tmp_path, env, said):
    (tmp_path / "carry").mkdir()
    r = kit({"CARRY": str(tmp_path / "carry"), "OUT": str(tmp_path / "out"), "KIT_DIR": str(tmp_path / "kit"),
             "PYTHON": sys.executable, **env})
    assert r.returncode == 2 and r.stderr.strip() == f"gpu_cluster: {said}", r.stderr
    assert not (tmp_path / "kit").exists()


def test_a_carry_that_is_not_there_is_one_line(tmp_path):
    r = kit({"CARRY": str(tmp_path / "none"), "OUT": str(tmp_path / "out")})
    assert r.returncode == 2
    assert r.stderr.strip() == (f"gpu_cluster: CARRY={tmp_path / 'none'} is not a folder "
                                "(python benchmarks/gpu_cluster_prepare.py makes it)")


def cotenant(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(COTENANT), "--device", "cpu", "--size", "64", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=gpuvs_env())


def test_cotenant_says_what_it_runs_on_reports_its_rate_and_stops_on_sigterm():
    p = cotenant("--every", "0.2")
    try:
        first = p.stdout.readline().strip()
        assert first == "cotenant running gpu=cpu uuid=-", first + p.stderr.read()
        rate = p.stdout.readline().strip()
        assert rate.startswith("cotenant rate=") and " TFLOP/s busy=" in rate
        assert float(rate.split("=")[1].split()[0]) >= 0 and 0.9 <= float(rate.split("busy=")[1]) <= 1.0
        p.send_signal(signal.SIGTERM)
        rest = p.communicate(timeout=30)[0].strip().splitlines()
    finally:
        p.kill()
    assert p.returncode == 0 and rest[-1].startswith("cotenant stopped after ") and rest[-1].endswith(" products")


def test_cotenant_stops_by_itself_after_its_seconds():
    p = cotenant("--seconds", "0.5")
    out = p.communicate(timeout=60)[0].strip().splitlines()
    assert p.returncode == 0 and out[0] == "cotenant running gpu=cpu uuid=-"
    assert out[-1].startswith("cotenant stopped after ")
    assert 0.5 <= float(out[-1].split()[3]) < 5


def test_a_light_cotenant_is_busy_about_its_share_of_the_time_and_says_what_it_measured():
    """--busy 0.2: in each 100 ms it computes about 20 ms (products of 64 x 64 take microseconds, so the share is
    held to within a few percent; the machine's load can only stretch a product, so the bound above is looser)."""
    p = cotenant("--busy", "0.2", "--every", "0.5", "--seconds", "2.2")
    out = p.communicate(timeout=60)[0].strip().splitlines()
    shares = [float(line.split("busy=")[1]) for line in out if line.startswith("cotenant rate=")]
    assert p.returncode == 0 and len(shares) >= 3, out
    assert all(0.19 <= s <= 0.35 for s in shares), shares


def test_cotenant_bad_input_is_one_line():
    r = subprocess.run([sys.executable, str(COTENANT), "--size", "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip() == "cotenant: --size, --seconds, --every and --period must be above 0"
    r = subprocess.run([sys.executable, str(COTENANT), "--busy", "1.5"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == "cotenant: --busy 1.5: a share of the time, above 0 and at most 1"


# -- the tables, from a real store --------------------------------------------------------------------------------------
def fp(uuid: str, driver: str = "580.159.04") -> dict:
    return {"gpu_name": "NVIDIA H200", "gpu_count": 1, "driver": driver, "cuda_visible_devices": uuid,
            "gpus": [{"index": 0, "name": "NVIDIA H200", "uuid": uuid, "memory_mib": 143771}],
            "node": {"kubelet": "v1.20.2", "kernel": "6.18.44"}}


def store_fleet(db: Path, exp_id: str, fps: dict[str, dict], slow: str | None = None) -> None:
    rows = [NodeRow(n, "slower" if n == slow else "equivalent", n_ok=4, n_trials=4,
                    speed=0.5 if n == slow else 1.0, speed_low=0.45 if n == slow else 0.98,
                    speed_high=0.55 if n == slow else 1.02, fingerprint=f) for n, f in fps.items()]
    res = FleetResult(exp_id, "cnn-train", "images/sec", True, 0.05, 0.95, AdaptiveTrials(4, 4, 4), ErrorControl(0.95, 1, len(rows)), 1,
                      rows, seconds=97.0)
    with Store(db) as st:
        st.create_experiment(exp_id, f"kit: fleet {exp_id}", "fleet", ExperimentMeta())
        st.update_meta(exp_id, fleet=res.to_dict())


def tables(*args: str) -> str:
    r = subprocess.run([sys.executable, str(TABLES), *args], capture_output=True, text=True, env=gpuvs_env(),
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_node_table_shows_each_gpu_and_what_differs_besides_it(tmp_path):
    db = tmp_path / "kit.db"
    nodes = {f"gpukit-node-{i}": fp(f"GPU-{c}") for i, c in enumerate("abc", 1)}
    store_fleet(db, "e1", nodes, slow="gpukit-node-3")
    out = tables("nodes", str(db), "e1")
    assert "| gpukit-node-3 | slower | 0.500 [0.450-0.550] | GPU-c | GPU-c |" in out
    assert "| gpukit-node-1 | equivalent | 1.000 [0.980-1.020] | GPU-a | GPU-a |" in out
    assert ("fields that differ between the 3 nodes: GPU UUID (NVML in the pod), CUDA_VISIBLE_DEVICES (device "
            "plugin). Besides the GPU's own identity: nothing.") in out
    nodes["gpukit-node-2"] = fp("GPU-b", driver="570.0")
    store_fleet(db, "e2", nodes)
    assert "Besides the GPU's own identity: NVIDIA driver." in tables("nodes", str(db), "e2")
    store_fleet(db, "e3", {f"gpukit-node-{i}": fp("GPU-a") for i in (1, 2)})
    assert ("Every node read the same GPU UUID (NVML in the pod) and CUDA_VISIBLE_DEVICES (device plugin): the "
            "nodes do not see distinct GPUs.") in tables("nodes", str(db), "e3")
    assert tables("ids", str(db)).split() == ["e1", "e2", "e3"]


def test_runs_table_names_the_cotenant_the_wall_time_and_the_verdicts(tmp_path):
    db, runs = tmp_path / "kit.db", tmp_path / "runs.tsv"
    nodes = {f"gpukit-node-{i}": fp(f"GPU-{c}") for i, c in enumerate("abc", 1)}
    store_fleet(db, "plain", nodes)
    store_fleet(db, "slowed", nodes, slow="gpukit-node-3")
    runs.write_text("plain\tcnn-train\t-\t-\t101.5\nslowed\tcnn-train\tgpukit-node-3\tGPU-c (NVIDIA H200)\t120.0\n"
                    "gone\tgemm\t-\t-\t12.0\n")
    out = tables("runs", str(db), str(runs)).splitlines()
    assert out[2] == ("| cnn-train | none | 101.5 s | none | gpukit-node-1 1.000 [0.980-1.020], gpukit-node-2 1.000 "
                      "[0.980-1.020], gpukit-node-3 1.000 [0.980-1.020] | none |")
    assert out[3].startswith("| cnn-train | gpukit-node-3: GPU-c (NVIDIA H200) | 120.0 s | gpukit-node-3 0.500 "
                             "[0.450-0.550] | gpukit-node-1 1.000")
    assert out[4].startswith("| gemm | none | 12.0 s | (no result) |")


# -- a dry run stopped by SIGTERM -----------------------------------------------------------------------------------------
@pytest.mark.cluster
def test_dry_run_stopped_by_sigterm_leaves_nothing_behind(tmp_path, k8s_build):
    """The kit's own cluster beside the test cluster, 2 kubelets whose device plugins run in --real mode over device
    nodes of the NVIDIA driver's numbers in the kit's own /dev (FAKE_GPUS: the real-GPU path, each node handing out its
    own GPU), SIGTERM to the kit's whole process group in the middle of its first fleet run: the markdown says so,
    and no process, cgroup root or bridge of it is left."""
    bins = Path(os.environ.get("GPUVS_K8S_CACHE", "/var/cache/gpuvs-k8s")) / "bin"
    if not all((bins / c).exists() for c in ("kube-apiserver", "kubelet", "kube-scheduler", "kube-controller-manager")):
        missing_part(f"the Kubernetes binaries in {bins} (scripts/test-cluster build)")
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        missing_part("a private mount namespace (unshare -m, as root)")
    carry, out, kit_dir, name = tmp_path / "carry", tmp_path / "out", Path("/tmp/gpukit-test"), "gpukitt"
    r = subprocess.run([sys.executable, str(PREPARE), str(carry), "--quick"], capture_output=True, text=True,
                       timeout=300, env=gpuvs_env())
    assert r.returncode == 0, r.stderr
    env = {**os.environ, "DEVICE": "cpu", "FAKE_GPUS": "1", "NODES": "2", "PARTS": "fleet", "FLEET": "spin", "CARRY": str(carry),
           "OUT": str(out), "KIT_DIR": str(kit_dir), "KIT_NAME": name, "PORT_OFFSET": "2000",
           "PYTHON": sys.executable}
    p = subprocess.Popen(["bash", str(KIT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        md = out / "gpu_cluster.md"
        while not (md.exists() and "## gpuvs fleet spin, no co-tenant" in md.read_text()):
            assert p.poll() is None, p.stdout.read()
            assert time.monotonic() < deadline, "the kit's cluster did not come up"
            time.sleep(1)
        time.sleep(5)  # inside the fleet run: pods running
        os.killpg(p.pid, signal.SIGTERM)
        log = p.communicate(timeout=180)[0]
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    text = md.read_text()
    shutil.rmtree(kit_dir, ignore_errors=True)  # its files (logs, the /dev copy): nothing runs from there now
    assert p.returncode == 143, log
    assert "(stopped by SIGTERM)" in text and f"Processes left that name {kit_dir}: none." in text
    assert "## The cluster (up in " in text and f"| {name}-node-1 | 12250 | nvidia0 /dev/nvidia0 |" in text
    assert f"| {name}-node-2 | 12270 | nvidia1 /dev/nvidia1 |" in text
    left = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and f"{kit_dir}/" in (proc / "cmdline").read_bytes().decode(errors="replace"):
                left.append(proc.name)
        except OSError:
            pass
    assert left == []
    assert not list(Path("/sys/fs/cgroup").glob(f"*/{name}-node-*")) and not list(
        Path("/sys/fs/cgroup").glob(f"{name}-node-*"))
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert f"{name}-br" not in links
    assert (out / "gpu_cluster.db").exists() and (out / "k8s-logs.txt").exists()


# -- the command part's table (benchmarks/command_gpu.sh) -------------------------------------------------------------
def test_the_command_parts_table_reads_two_real_stored_studies(tmp_path):
    """command_gpu_table.py on a real store: a command study (a script printing its rate every step, read with
    --step-metric) and a second study with the same arm names, their means, the verdict, the ratio per arm."""
    env = gpuvs_env()
    (tmp_path / "loop.py").write_text("import os\nfor i in range(1, 6):\n"
                                      "    print(f'step {i}: {float(os.environ[\"RATE\"]) + i % 2:.1f} images/sec')\n")
    r = subprocess.run([sys.executable, "-m", "gpuvs", "compare", "command", "--device", "cpu", "--trials", "2",
                        "--step-metric", r"images_per_sec=step \d+: ([0-9.]+) images/sec,rate,images/sec",
                        "--headline", "images_per_sec", "--arm", "host:env_var=RATE=100",
                        "--arm", "pod:env_var=RATE=98", "--", sys.executable, "loop.py"],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "gpuvs", "compare", "selftest", "--device", "cpu", "--trials", "2",
                        "--arm", "host:steps=3", "--arm", "pod:steps=4"], capture_output=True, text=True,
                       cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    st = Store(tmp_path / "gpuvs.db")
    cmd, other = sorted((e.id for e in st.experiments()), key=lambda i: st.experiment(i).created)
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "command_gpu_table.py"), str(tmp_path / "gpuvs.db"),
                        cmd, other, "yes"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("| the user's script")]
    # each trial's figure is the mean of its per-step rates: 100 + (1, 0, 1, 0, 1) / 5 = 100.6, and 98.6
    assert len(rows) == 1 and "| 100.6 [100.6-100.6] (2/2 trials) | 98.6 [98.6-98.6] (2/2 trials) |" in rows[0]
    assert "- Verdict, the user's script: pod vs host: 0.9801x" in r.stdout
    host = [ln for ln in r.stdout.splitlines() if ln.startswith("- host: the user's script / gpuvs cnn-train = ")]
    assert len(host) == 1 and "the 3% target" in host[0]
    assert "waits for the GPU after every step" in r.stdout


def test_the_check_parts_image_is_python_and_glibc_alone_and_runs(tmp_path):
    """benchmarks/gpu_check_image.py: the image the kit's `check` part runs gpu-check in holds this machine's
    interpreter, its standard library, numpy and glibc: no other package, no GPU library (the device plugin brings
    the driver's); its interpreter runs from that root alone (chroot) and can load what gpu-check's worker uses."""
    import tarfile

    out = tmp_path / "check.tar"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu_check_image.py"), str(out)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "localhost/gpuvs-check:kit" in r.stdout and "no other site-packages" in r.stdout
    with tarfile.open(out) as tar:
        (entry,) = json.load(tar.extractfile("manifest.json"))
        assert entry["RepoTags"] == ["localhost/gpuvs-check:kit"]
        layer = tar.extractfile(entry["Layers"][0])
        with tarfile.open(fileobj=layer) as files:
            names = files.getnames()
            files.extractall(tmp_path / "root")
    libs = [n.rsplit("/", 1)[-1] for n in names if ".so" in n]
    packages = {n.split("-packages/", 1)[1].split("/")[0] for n in names if "-packages/" in n}
    assert packages <= {"numpy", "numpy.libs"} and "numpy" in packages, packages
    assert not [n for n in libs if any(w in n.lower() for w in ("cuda", "nvidia", "torch", "cublas", "nvrtc"))]
    assert {"libc.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1"} <= set(libs), sorted(set(libs))[:40]
    r = subprocess.run(["chroot", str(tmp_path / "root"), "/usr/bin/python3", "-I", "-c",
                        "import ctypes, json, sqlite3, numpy; ctypes.CDLL('librt.so.1'); print(numpy.ones(3).sum())"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
