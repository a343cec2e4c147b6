"""gpu-check (workloads/gpu_check.py, workloads/_driver/): the GPU check that needs nothing but the NVIDIA driver.

Without a driver: one clear line and a non-zero exit, from the CLI, from the worker and in gpuvs's own image.
With a GPU (-m gpu): every figure measured and checked, in a process that maps no PyTorch, CUDA runtime or NVRTC.
On the test cluster, the agent's default is this check on nodes that advertise GPUs, and spin elsewhere."""

from __future__ import annotations

import ctypes
import json
import shutil
import sqlite3
import subprocess
import sys

import pytest
from cluster import cluster, k8s_build  # noqa: F401  (the session fixtures)

import gpuvs
from conftest import ROOT, gpuvs_env, missing_part
from gpuvs import workloads
from gpuvs.errors import WorkloadError
from gpuvs.spec import RunSpec
from gpuvs.workloads import gpu_check
from gpuvs.workloads._driver import ptx


def driver_here() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


NO_DRIVER = pytest.mark.skipif(driver_here(), reason="this machine has the NVIDIA driver: the refusal is for one "
                               "without (the GPU tests below cover this one)")
REFUSAL = "gpu-check needs the NVIDIA driver's libcuda.so.1; none found: libcuda.so.1: cannot open shared object file"
IMAGE = f"localhost/gpuvs:{gpuvs.__version__}"
SERIES = ("fp32_fma", "fp16_mma", "d2d_copy", "h2d_pinned", "d2h_pinned", "launch")


@NO_DRIVER
def test_gpuvs_run_gpu_check_without_a_driver_is_one_line_and_exit_2(cli, tmp_path):
    r = cli("run", "gpu-check")
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines == [f"gpuvs: error: {REFUSAL}: No such file or directory"], r.stderr
    assert not (tmp_path / "gpuvs.db").exists() or sqlite3.connect(tmp_path / "gpuvs.db").execute(
        "SELECT COUNT(*) FROM trials").fetchone()[0] == 0


@NO_DRIVER
def test_the_worker_without_a_driver_fails_its_trial_with_that_line(tmp_path):
    """As in a pod on a GPU node whose device plugin did not hand it the driver's files: the worker is asked for
    cuda, finds no libcuda.so.1, and sends one error event (kind unavailable, exit status 4), no traceback."""
    spec = RunSpec(workload="gpu-check", params={}, device="cuda")
    r = subprocess.run([sys.executable, "-m", "gpuvs.trial.worker"], capture_output=True, text=True, timeout=120,
                       env=gpuvs_env(GPUVS_SPEC=spec.to_json()), cwd=tmp_path)
    events = [json.loads(line) for line in r.stdout.splitlines()]
    assert r.returncode == 4 and "Traceback" not in r.stderr, r.stderr
    assert events[-1]["type"] == "error" and events[-1]["kind"] == "unavailable"
    assert events[-1]["message"].startswith(REFUSAL), events[-1]
    assert not any(e["type"] == "sample" for e in events)


def test_a_cpu_device_is_refused_before_anything_starts():
    w = workloads.get("gpu-check")
    with pytest.raises(gpuvs.errors.UsageError) as err:
        w.validate({}, "cpu")
    want = "gpu-check measures a GPU: --device cpu is not one" if driver_here() else REFUSAL
    assert str(err.value).startswith(want)
    assert w.validate({"steps": 3}, "cuda:1")["steps"] == 3 and gpu_check.ordinal("cuda:1") == 1


def test_every_figure_is_declared_with_its_direction_and_fma_is_the_headline():
    w = workloads.get("gpu-check")
    assert w.requires == () and w.headline_series({}) == "fp32_fma"
    assert [d.pattern for d in w.metrics if d.headline] == ["fp32_fma"]
    for name in SERIES:
        d = w.declared(name)
        assert d is not None and d.better == ("lower" if name == "launch" else "higher"), name
    assert w.declared("d2d_copy/pct_of_peak").tested is False


def test_a_wrong_result_fails_the_trial_naming_the_first_difference():
    import struct

    want = struct.pack("f", ptx.fma_sum(4096)) * 8
    gpu_check.same(want, want, "x", 4)  # the same: no error
    got = want[:12] + struct.pack("f", 1.5) + want[16:]
    with pytest.raises(WorkloadError, match=r"the fp32 FMA kernel gave a wrong result: element 3 is 1\.5, "
                       r"expected 524316\.0") as err:
        gpu_check.same(got, want, "the fp32 FMA kernel", 4)
    assert err.value.kind == "crash"
    with pytest.raises(WorkloadError, match="byte 5 differs"):
        gpu_check.same(b"\x00" * 5 + b"\x01", b"\x00" * 6, "the copy")


def test_the_known_sums_are_exact_in_fp32():
    """Every value a kernel accumulates, and each thread's sum, is a whole number below 2^24: fp32 holds it exactly,
    so the check is equality, not a tolerance."""
    assert ptx.fma_sum(gpu_check.FMA_ITERS) == 28 + 8 * 16 * 4096 < 2 ** 24
    assert ptx.mma_sum(gpu_check.MMA_ITERS) == 4 * 28 + 32 * 16 * 4 * 2048 < 2 ** 24
    assert ptx.fma_flops(1) == 2 * 8 * 16 and ptx.mma_flops(1) == 4096 * 8 * 4


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas (CUDA toolkit) not here: the PTX is checked by "
                    "the driver's JIT on a GPU (-m gpu)")
@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_90"])
def test_the_ptx_assembles_for_each_architecture(arch, tmp_path):
    """The kernels' PTX as the driver's JIT gets it, assembled by ptxas where the toolkit is installed (the check
    never needs it): the basic module for every architecture, the tensor-core module from sm_80."""
    texts = {"basic": ptx.basic()} | ({"tensor": ptx.tensor()} if arch >= "sm_80" else {})
    for name, text in texts.items():
        src = tmp_path / f"{name}.ptx"
        src.write_text(text)
        r = subprocess.run(["ptxas", f"-arch={arch}", str(src), "-o", str(tmp_path / f"{name}.cubin")],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (name, r.stderr)


@NO_DRIVER
def test_gpuvs_own_image_starts_the_check_and_refuses_cleanly(k8s_build):  # noqa: F811
    """In gpuvs's image (no PyTorch, no driver here) with this checkout's source: `gpuvs run gpu-check` is one line
    and exit 2; its worker asked for cuda is one error event and exit 4."""
    if shutil.which("podman") is None:
        missing_part("podman runs gpuvs's image: `podman` is not on PATH")
    from gpuvs.environments import engine

    eng = engine.detect("podman")
    if subprocess.run(eng.argv("image", "exists", IMAGE), capture_output=True).returncode != 0:
        missing_part(f"gpuvs's image {IMAGE} is not built (scripts/build-image)")
    mount = ["-v", f"{ROOT / 'src'}:/gpuvs-src:ro", "-e", "PYTHONPATH=/gpuvs-src"]
    run = [*eng.argv("run", "--rm", *eng.run_args, *mount)]
    r = subprocess.run([*run, IMAGE, "run", "gpu-check", "--store", "/tmp/gc.db"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert [ln for ln in r.stderr.splitlines() if ln.strip()] == [f"gpuvs: error: {REFUSAL}: No such file or "
                                                                  "directory"], r.stderr
    spec = RunSpec(workload="gpu-check", params={}, device="cuda").to_json()
    r = subprocess.run([*run, "-e", f"GPUVS_SPEC={spec}", "--entrypoint", "python3", IMAGE, "-c",
                        "import sys, gpuvs.trial.worker as w; code = w.main([]); "
                        "sys.stderr.write('torch: %s\\n' % ('torch' in sys.modules)); sys.exit(code)"],
                       capture_output=True, text=True, timeout=300)
    last = json.loads(r.stdout.splitlines()[-1])
    assert r.returncode == 4 and last["kind"] == "unavailable" and last["message"].startswith(REFUSAL), r.stdout
    assert "torch: False" in r.stderr and "Traceback" not in r.stderr, r.stderr


# -- the agent's default --------------------------------------------------------------------------------------------

def test_the_agents_default_is_the_gpu_check_on_gpu_nodes_and_spin_elsewhere():
    from gpuvs.agent.config import AgentConfig, WorkloadSpec

    c = AgentConfig()
    assert [str(w) for w in c.workloads_for(True)] == ["gpu-check:device=cuda"]
    assert [str(w) for w in c.workloads_for(False)] == ["spin"]
    given = AgentConfig(workloads=[WorkloadSpec.parse("spin:steps=3")])
    assert [str(w) for w in given.workloads_for(True)] == ["spin:steps=3"]


@pytest.mark.cluster
def test_on_the_test_cluster_the_agent_chooses_the_gpu_check_in_its_own_image(cluster):  # noqa: F811
    """The test cluster's nodes advertise nvidia.com/gpu (fake GPUs): the agent's fleet there is gpu-check on cuda
    in the agent's own image, each pod asking for a GPU; with a GPU resource no node advertises, spin on the CPU."""
    from gpuvs.agent.config import AgentConfig
    from gpuvs.agent.ledger import RunRecord
    from gpuvs.agent.runs import fleet_request, has_gpus
    from gpuvs.fleet.cluster import sweep as fleet_kube
    from gpuvs.kube import client

    c = AgentConfig(kubeconfig=str(cluster.kubeconfig))
    found = fleet_kube.nodes(client.connect(c.kubeconfig, None, None))
    assert has_gpus(found, c.gpu_resource)
    (w,) = c.workloads_for(has_gpus(found, c.gpu_resource))
    base, o = fleet_request(c, RunRecord("r1", "api"), "default", IMAGE, cluster.nodes, w)
    assert (base.workload, base.device, base.num_gpus) == ("gpu-check", "cuda", 1)
    assert base.env.kind == "pod" and base.env.options["image"] == IMAGE
    assert o.command.startswith(f"gpuvs fleet gpu-check --image {IMAGE} ") and "--device cuda" in o.command
    other = AgentConfig(kubeconfig=str(cluster.kubeconfig), gpu_resource="example.com/no-such-gpu")
    (w,) = other.workloads_for(has_gpus(found, other.gpu_resource))
    base, _ = fleet_request(other, RunRecord("r2", "api"), "default", IMAGE, cluster.nodes, w)
    assert (base.workload, base.device) == ("spin", "cpu")


LOADED = r"""
import json, sys
if sys.argv[1] == "torch":
    import torch
    torch.zeros(1)
from gpuvs.workloads.gpu_check import gpu_code_loaded
print(json.dumps(gpu_code_loaded()))
"""


@pytest.mark.parametrize("framework", ["none", "torch"])
def test_the_check_tells_the_driver_from_a_framework_in_its_own_process(framework):
    """What the check's trial records of itself (configuration items, read from /proc/self/maps and sys.modules):
    in a process that imported PyTorch, its package and PyTorch's libraries (with the CUDA runtime's, in a CUDA
    build), none of them counted as the driver's; in one that did not (the check's, on this machine without a driver), nothing."""
    r = subprocess.run([sys.executable, "-c", LOADED, framework], capture_output=True, text=True, timeout=300,
                       env=gpuvs_env())
    assert r.returncode == 0, r.stderr[-2000:]
    driver, other, mods = json.loads(r.stdout)
    assert not any(lib.startswith(("libtorch", "libcudart", "libcublas", "libc10")) for lib in driver), driver
    if framework == "none":
        assert (other, mods) == ([], []) and all(lib.startswith(("libcuda.so", "libnvidia-")) for lib in driver)
    else:
        assert "torch" in mods and any(lib.startswith("libtorch") for lib in other), (other, mods)


# -- on a GPU ------------------------------------------------------------------------------------------------------

CHECK_IN_PROCESS = r"""
import json, sys
from gpuvs import workloads
from gpuvs.spec import RunSpec
from gpuvs.workloads.workload import RunContext
w = workloads.get("gpu-check")
spec = RunSpec(workload="gpu-check", params={"steps": 3, "block_ms": 5.0, "copy_mib": 64}, device="cuda")
evs = list(w.run(RunContext(spec=spec, params=w.validate(spec.params, "cuda"))))
maps = open("/proc/self/maps").read()
libs = sorted({line.split()[-1].rsplit("/", 1)[-1] for line in maps.splitlines() if ".so" in line.split()[-1]})
print(json.dumps({"events": evs, "libs": libs, "modules": sorted(m for m in sys.modules if m.split(".")[0] in
                  ("torch", "cupy", "cuda", "numba", "pycuda"))}))
"""


@pytest.mark.gpu
@pytest.mark.skipif(not driver_here(), reason="needs the NVIDIA driver (libcuda.so.1) and a GPU")
def test_on_a_gpu_every_figure_is_measured_and_checked_with_only_the_driver(tmp_path):
    r = subprocess.run([sys.executable, "-c", CHECK_IN_PROCESS], capture_output=True, text=True, timeout=600,
                       env=gpuvs_env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.splitlines()[-1])
    samples = [e for e in out["events"] if e["type"] == "sample"]
    got = {e["series"] for e in samples}
    cc = next(e for e in out["events"] if e["type"] == "config")["items"]["compute_capability"]
    assert got == set(SERIES) - (set() if float(cc) >= 8.0 else {"fp16_mma"}), got
    assert all(e["value"] > 0 for e in samples) and len(samples) == 3 * len(got)
    assert any(lib.startswith("libcuda.so") for lib in out["libs"]) and out["modules"] == [], out
    bad = [lib for lib in out["libs"] if lib.startswith(("libcudart", "libnvrtc", "libtorch", "libcublas"))]
    assert bad == [], bad
    said = {k: v for e in out["events"] if e["type"] == "config" for k, v in e["items"].items()}
    assert said["other_gpu_libraries_mapped"] == "none" and said["gpu_packages_imported"] == "none", said
    assert "libcuda.so" in said["driver_libraries_mapped"], said


@pytest.mark.gpu
@pytest.mark.skipif(not driver_here(), reason="needs the NVIDIA driver (libcuda.so.1) and a GPU")
def test_gpuvs_run_gpu_check_stores_every_figure(cli, tmp_path):
    r = cli("run", "gpu-check", "--steps", "3", "--block-ms", "5", "--device", "cuda")
    assert r.returncode == 0, r.stdout + r.stderr
    db = sqlite3.connect(tmp_path / "gpuvs.db")
    series = {s for (s,) in db.execute("SELECT DISTINCT series FROM samples")}
    assert {"fp32_fma", "d2d_copy", "h2d_pinned", "d2h_pinned", "launch"} <= series
    assert "fp32_fma" in r.stdout and "TFLOP/s" in r.stdout
    # "where the time went" counts every figure's timed blocks as measured, not the headline's alone
    blocks = [sec if sec is not None else json.loads(extra)["block_s"]
              for sec, extra in db.execute("SELECT seconds, extra FROM samples")]
    startup = json.loads(db.execute("SELECT startup FROM trials").fetchone()[0])
    assert startup["timed_s"] == pytest.approx(sum(blocks), rel=1e-6) and startup["timed_s"] > 0
