"""Containers for real: podman running `--rootfs /:O`, an overlay of this machine's root.

So the host's Python and torch are inside without any image pull. .ci/run installs podman (.ci/apt/containers.txt)."""

import json
import os
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import tarfile
import time
import uuid

import pytest
import yaml

from conftest import ROOT, gpuvs_env
from gpuvs import workloads
from gpuvs.environments import engine as engines
from gpuvs.environments import gpu_access
from gpuvs.environments.container import ContainerEnvironment
from gpuvs.errors import GpuvsError
from gpuvs.trial.overrides import SPEC_FIELDS
from gpuvs.trial.runner import Arm, Experiment, Runner
from gpuvs.environments import option_keys
from gpuvs.spec import EnvSpec, RunSpec
from gpuvs.store.db import Store

OVERLAY = {"rootfs": "/:O", "engine": "podman"}


def podman(*args):
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=60)


def gpuvs_containers():
    r = podman("ps", "-a", "--filter", "label=gpuvs", "--format", "{{.Names}}")
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def processes(match):
    """PIDs of live processes whose command line passes match(cmdline bytes)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                cmd = open(f"/proc/{d}/cmdline", "rb").read()
            except OSError:
                continue
            if match(cmd):
                out.append(int(d))
    return out


def in_a_pod(pid: int) -> bool:
    """A process of a Kubernetes pod (the test cluster's, which runs its pods' workers on this machine too)."""
    try:
        return "/kubepods" in open(f"/proc/{pid}/cgroup").read()
    except OSError:
        return False


def inside_processes():
    """This machine's containerised workers, not a pod's: another suite's cluster tests may run beside these."""
    return [p for p in processes(lambda cmd: b"gpuvs.trial.inside" in cmd) if not in_a_pod(p)]


def container_spec(workload="selftest", device="cpu", **params):
    return RunSpec(workload=workload, device=device, params=params, env=EnvSpec("container", dict(OVERLAY)))


@pytest.fixture(autouse=True)
def nothing_left_behind():
    yield
    assert gpuvs_containers() == []


# -- end to end -----------------------------------------------------------------------------------

def test_container_run_limits_seen_inside_and_spec_never_through_a_shell(cli, tmp_path):
    box = tmp_path / "box"
    box.mkdir()
    evil = f'''a "b" 'c'; touch {box}/semi $(touch {box}/dollar) `touch {box}/tick` && touch {box}/and'''
    r = cli("run", "selftest", "--env", "container", "--rootfs", "/:O", "--steps", "3", "--text", evil,
            "--cpus", "1", "--memory", "256m", "--shm-size", "128m", "--mount", f"{box}:{box}",
            "--env-var", "GPUVS_TEST_VAR=x y;z", "--ulimit", "stack=4194304:4194304", "--device", "cpu")
    assert r.returncode == 0, r.stdout + r.stderr
    assert " ".join(f"text {evil}".split()) in " ".join(r.stdout.split())  # echoed back verbatim...
    assert list(box.iterdir()) == []  # ...and nothing in it ran, though the folder was writable inside
    row = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT fingerprint, startup, status FROM trials").fetchone()
    fp, startup = json.loads(row[0]), json.loads(row[1])
    assert row[2] == "ok" and fp["in_container"] and fp["pid"] == 1 and fp["container_image"] == "rootfs:/:O"
    assert fp["limits"]["cpu_limit"] == 1.0 and fp["limits"]["memory_limit_mib"] == 256
    assert fp["limits"]["shm_mib"] == 128 and fp["limits"]["rlimits"]["stack"] == [4194304, 4194304]
    assert 0 < startup["launch_to_worker_s"] < startup["launch_to_exit_s"]


def test_container_is_named_labelled_unprivileged_without_network(store_path):
    seen = {}

    def inspect_once(result, event):
        if event["type"] == "sample" and not seen:
            name = f"gpuvs-{result.spec.run_id}"
            seen.update(json.loads(podman("inspect", name).stdout)[0])
            seen["podman_cmdline"] = [open(f"/proc/{p}/cmdline", "rb").read() for p in _podman_clients(name)]

    spec = container_spec(steps=6, step_seconds=0.3)
    with Store(store_path) as st:
        res = Runner(st, on_event=inspect_once, timeout_s=120).run_trial(spec)
    assert res.ok, res.error
    assert seen["Name"] == f"gpuvs-{spec.run_id}"
    assert seen["Config"]["Labels"]["gpuvs"] == "1" and seen["Config"]["Labels"]["gpuvs.run_id"] == spec.run_id
    host = seen["HostConfig"]
    assert host["Privileged"] is False and not host.get("CapAdd") and host["NetworkMode"] == "none"
    assert host["AutoRemove"] is True
    env = dict(e.split("=", 1) for e in seen["Config"]["Env"])
    assert json.loads(env["GPUVS_SPEC"])["run_id"] == spec.run_id  # the spec went in as a variable...
    assert seen["podman_cmdline"] and not any(b'"workload"' in c for c in seen["podman_cmdline"])  # ...not argv


def _podman_clients(name):
    return processes(lambda cmd: cmd.split(b"\0")[0].endswith(b"podman") and name.encode() in cmd)


def test_timeout_and_failure_remove_the_container(store_path):
    with Store(store_path) as st:
        slow = Runner(st, timeout_s=5).run_trial(container_spec(steps=1000, step_seconds=0.2, children=1))
        crash = Runner(st).run_trial(container_spec(steps=5, fail_at_step=2))
    assert slow.status == "failed" and slow.error_kind == "timeout" and "timed out after 5 s" in slow.error
    assert crash.status == "failed" and crash.error == "selftest failed at step 2 as asked"
    time.sleep(0.5)
    assert gpuvs_containers() == [] and inside_processes() == []


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_stopped_containerised_run_leaves_no_container(tmp_path, sig, status):
    proc = subprocess.Popen([sys.executable, "-m", "gpuvs", "run", "selftest", "--env", "container", "--rootfs", "/:O",
                             "--steps", "200", "--step-seconds", "0.2", "--trials", "2", "--quiet", "--device", "cpu"],
                            cwd=tmp_path,
                            env=gpuvs_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and not gpuvs_containers():
        time.sleep(0.2)
    assert gpuvs_containers(), "the container never started"
    time.sleep(1.5)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == status, err
    assert "finished trials are kept" in err and "Traceback" not in err
    rows = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT status, error FROM trials").fetchall()
    assert rows == [("interrupted", "interrupted by the user" if sig == signal.SIGINT else
                     f"gpuvs was stopped by {signal.Signals(sig).name}")]
    assert gpuvs_containers() == [] and inside_processes() == []


def test_startup_workload_on_host_and_in_a_container(store_path):
    base = RunSpec(workload="startup", device="cpu", params={"job": "kernel"})
    exp = Experiment("startup", base, [Arm("host", {"env": "host"}), Arm("container", {"env": "container", **OVERLAY})],
                     trials=1, seed=0)
    with Store(store_path) as st:
        results = Runner(st, timeout_s=300).run_experiment(exp)
    assert [r.status for r in results] == ["ok", "ok"], [r.error for r in results]
    for r in results:
        s = {k: v.value for k, v in r.summary.items()}
        assert list(s) == ["first_result_s", "ready_s", "device_init_s", "first_op_s"]
        assert r.summary["first_result_s"].unit == "s" and not r.summary["first_result_s"].higher_is_better
        assert all(v >= 0 for v in s.values())
        assert s["first_result_s"] == pytest.approx(s["ready_s"] + s["device_init_s"] + s["first_op_s"], abs=1e-3)
        assert r.startup["import_s"] < s["ready_s"] < r.startup["launch_to_exit_s"]
        assert (r.fingerprint.get("container_image") == "rootfs:/:O") == (r.spec.arm == "container")


# -- faults ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, env, message", [
    (["--rootfs", "/:O"], {"PATH": "/nonexistent"}, "no container engine found on PATH: install podman"),
    (["--image", "localhost/gpuvs-no-such-image:1"], {}, "image localhost/gpuvs-no-such-image:1 is not present in "
                                                         "podman's local storage"),
    (["--rootfs", "/:O", "--engine", "docker"], {"DOCKER_HOST": "unix:///nonexistent/docker.sock"},
     "docker is installed but its daemon is not running" if shutil.which("docker")
     else "container engine docker not found on PATH"),
])
def test_faults_are_one_line_and_exit_2_before_anything_starts(cli, tmp_path, args, env, message):
    r = cli("run", "selftest", "--env", "container", "--device", "cpu", "--steps", "1", *args, **env)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("gpuvs: error:")]
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "gpuvs.db").exists()


@pytest.mark.parametrize("options, device, message", [
    ({"rootfs": "/:O", "engine_arg": ["--remote", "--url", "unix:///nonexistent/podman.sock"]}, "cpu",
     "podman is not running or not reachable"),
    ({"rootfs": "/no/such/dir:O"}, "cpu", "--rootfs /no/such/dir:O: /no/such/dir is not a folder"),
    ({}, "cpu", "--env container needs --image IMAGE"),
    ({"rootfs": "/:O", "image": "x"}, "cpu", "give --image or --rootfs, not both"),
    ({"rootfs": "/:O"}, "cuda", "device cuda asked for, but this machine has no usable NVIDIA GPU"),
    ({"rootfs": "/:O", "memory": "lots"}, "cpu", "--memory: 'lots' is not a size"),
    ({"rootfs": "/:O", "cpus": 1000}, "cpu", "--cpus 1000 is more than the"),
    ({"rootfs": "/:O", "ulimit": "stack"}, "cpu", "--ulimit: expected NAME=SOFT[:HARD]"),
    ({"rootfs": "/:O", "ulimit": ["nofile=10:5"]}, "cpu", "the soft limit is above the hard limit"),
    ({"rootfs": "/:O", "mount": ["/no/such:/x"]}, "cpu", "/no/such is not an existing absolute path"),
    ({"rootfs": "/:O", "mount": [f"{ROOT}:rel"]}, "cpu", "rel must be an absolute path inside"),
    ({"rootfs": "/:O", "env_var": ["GPUVS_SPEC=x"]}, "cpu", "gpuvs sets the run spec itself"),
    ({"rootfs": "/:O", "engine_arg": ["--privileged"]}, "cpu", "gpuvs never runs containers privileged"),
    ({"rootfs": "/:O", "engine_arg": "--cap-add=SYS_ADMIN"}, "cpu", "gpuvs never runs containers privileged"),
    ({"rootfs": "/:O", "gpus": "toolkit"}, "cpu", "--gpus toolkit is docker's"),
    ({"rootfs": "/:O", "gpus": "none"}, "cuda:0", "no usable NVIDIA GPU"),
])
def test_bad_container_options_are_refused_before_anything_starts(options, device, message):
    env = ContainerEnvironment(options)
    with pytest.raises(GpuvsError) as err:
        env.check(RunSpec(workload="selftest", device=device, env=EnvSpec("container", options)))
    assert message in str(err.value) and err.value.exit_code == 2


def test_a_ulimit_above_what_the_engine_can_set_is_refused():
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    options = {"rootfs": "/:O", "ulimit": [f"nofile={hard + 1}:{hard + 1}", "stack=8388608"]}
    env = ContainerEnvironment(options)
    spec = RunSpec(workload="selftest", device="cpu", env=EnvSpec("container", options))
    if engines.has_capability(engines.CAP_SYS_RESOURCE):  # an engine with it may raise the limit
        env.check(spec)
    else:
        with pytest.raises(GpuvsError, match=rf"above this process's hard limit \({hard}\)"):
            env.check(spec)


def test_a_container_without_python_is_a_failed_trial_naming_it(cli, tmp_path):
    empty = tmp_path / "root"
    empty.mkdir()
    r = cli("run", "selftest", "--env", "container", "--rootfs", str(empty), "--steps", "1", "--device", "cpu")
    flat = " ".join(r.stdout.split())
    assert r.returncode == 1
    assert f"the container (rootfs {empty}) has no python3: gpuvs needs Python 3.10+ inside" in flat, r.stdout
    # the same from an image: a real (tiny) image without Python, imported into podman's storage
    tar_path = tmp_path / "img.tar"
    (tmp_path / "hello.txt").write_text("no python here\n")
    with tarfile.open(tar_path, "w") as tar:
        tar.add(tmp_path / "hello.txt", arcname="hello.txt")
    image = f"localhost/gpuvs-test-nopython:{uuid.uuid4().hex[:8]}"
    assert podman("import", str(tar_path), image).returncode == 0
    try:
        with Store(tmp_path / "img.db") as st:
            res = Runner(st).run_trial(RunSpec(workload="selftest", device="cpu",
                                               env=EnvSpec("container", {"image": image})))
        assert res.status == "failed" and res.error_kind == "unavailable"
        assert res.error.startswith(f"the container (image {image}) has no python3"), res.error
    finally:
        podman("rmi", "-f", image)


@pytest.mark.skipif(not os.path.exists("/usr/bin/python3"), reason="needs the distribution's Python")
def test_a_python_without_the_modules_gpuvs_needs_is_named(store_path):
    # Debian's /usr/bin/python3 (numpy and torch live in another interpreter here): a Python without numpy
    bare = subprocess.run(["/usr/bin/python3", "-c", "import numpy"], capture_output=True).returncode != 0
    spec = RunSpec(workload="selftest", device="cpu", env=EnvSpec("container", {**OVERLAY, "python": "/usr/bin/python3"}))
    with Store(store_path) as st:
        res = Runner(st).run_trial(spec)
    if bare:
        assert res.status == "failed" and res.error_kind == "unavailable"
        assert res.error.startswith("No module named 'numpy' (python 3.") and "/usr/bin/python3" in res.error
    else:
        assert res.ok, res.error


def test_doctor_reports_what_the_container_sees_and_what_is_missing(cli, tmp_path):
    r = cli("doctor", "--env", "container", "--rootfs", "/:O", "--device", "cpu", "--cpus", "1", "--shm-size", "96m")
    flat = " ".join(r.stdout.split())
    assert r.returncode == 0, r.stdout + r.stderr
    assert "start a container │ ok" in flat and "all checks passed" in flat
    assert "CPU limit 1.0" in flat and "/dev/shm 96 MiB" in flat and "torch │ ok" in flat
    empty = tmp_path / "root"
    empty.mkdir()
    r = cli("doctor", "--env", "container", "--rootfs", str(empty), "--device", "cpu")
    assert r.returncode == 2 and r.stderr.count("gpuvs: error:") == 1
    assert f"start a container: the container (rootfs {empty}) has no python3" in r.stderr, r.stderr


class _GpuAccess(ContainerEnvironment):
    """The real container path with a chosen GPU access plan (this machine has no GPU to pass)."""

    plan: gpu_access.GpuPlan

    def gpu_plan(self, spec, eng=None):
        return self.plan


def _error_of(env, spec):
    """Run one spec in this environment object as the runner does; the last error event's message."""
    from gpuvs import events

    launched = env.launch(spec)
    message = None
    try:
        for line in launched.read(time.monotonic() + 120):
            ev = events.decode(line)
            if ev and ev["type"] == "error":
                message = ev["message"]
        assert launched.wait(30) == 4  # the worker's status for "unavailable"
    finally:
        launched.close()
    return message


def test_gpu_not_visible_inside_is_a_failed_trial_saying_what_is_missing(tmp_path):
    dev, drv = tmp_path / "dev", tmp_path / "nvidia"
    dev.mkdir()
    for name in ("nvidiactl", "nvidia0", "nvidia-uvm"):
        os.mknod(dev / name, 0o666 | 0o020000, os.makedev(1, 3))  # character devices (/dev/null's numbers)
    (drv / "lib64").mkdir(parents=True)
    (drv / "lib64" / "libcuda.so.1").write_text("not a library")
    no_gpu = _GpuAccess(OVERLAY)
    no_gpu.plan = gpu_access.GpuPlan("none")
    fake = _GpuAccess(OVERLAY)
    fake.plan = gpu_access.devices_plan(str(dev), str(drv))
    # a GPU run that fails (here: as asked, at its first step) is followed by a look at the GPU from inside
    results = [_error_of(env, container_spec(device="cuda", fail_at_step=1)) for env in (no_gpu, fake)]
    assert results[0].startswith("GPU not visible inside the container: no /dev/nvidiactl inside the container")
    # nodes, the driver folder and LD_LIBRARY_PATH reached the container; the fake libcuda does not load
    assert results[1].startswith("GPU not visible inside the container: libcuda.so.1 cannot be loaded")
    assert f"LD_LIBRARY_PATH={drv}/lib64" in results[1]


# -- pieces without containers --------------------------------------------------------------------

def test_devices_plan_mounts_a_driver_folder_or_single_driver_files(tmp_path):
    dev = tmp_path / "dev"
    (dev / "nvidia-caps").mkdir(parents=True)
    for name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia1", "nvidia0", "nvidia10", "nvidia-caps/c1"):
        (dev / name).write_text("")
    drv = tmp_path / "usr-local-nvidia"
    (drv / "lib64").mkdir(parents=True)
    (drv / "bin").mkdir()
    (drv / "lib64" / "libcuda.so.1").write_text("")
    p = gpu_access.devices_plan(str(dev), str(drv))
    devices = [p.args[i + 1] for i, a in enumerate(p.args) if a == "--device"]
    assert devices == [f"{dev}/{n}:/dev/{n}" for n in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia0",
                                                         "nvidia1", "nvidia10", "nvidia-caps/c1")]
    assert ["-v", f"{drv}:{drv}:ro"] == p.args[-2:] and p.ld_library_path == [f"{drv}/lib64"]
    assert p.path == [f"{drv}/bin"]
    # a system library folder: only the driver's files, one read-only mount each, under INSIDE_DIR
    sysdir = tmp_path / "lib"
    sysdir.mkdir()
    for name in ("libcuda.so.550.1", "libnvidia-ml.so.550.1", "libc.so.6", "libcudart.so.12"):
        (sysdir / name).write_text("")
    os.symlink("libcuda.so.550.1", sysdir / "libcuda.so.1")
    p2 = gpu_access.devices_plan(str(dev), lib_dirs=(str(tmp_path / "nothing"), str(sysdir)))
    mounts = [p2.args[i + 1] for i, a in enumerate(p2.args) if a == "-v"]
    inside = gpu_access.INSIDE_DIR + "/lib64"
    libs = [m for m in mounts if ":" + inside in m]
    assert libs == [f"{sysdir}/libcuda.so.550.1:{inside}/libcuda.so.1:ro",
                    f"{sysdir}/libcuda.so.550.1:{inside}/libcuda.so.550.1:ro",
                    f"{sysdir}/libnvidia-ml.so.550.1:{inside}/libnvidia-ml.so.550.1:ro"]
    assert p2.ld_library_path == [inside]
    with pytest.raises(Exception, match="nvidiactl is missing"):
        gpu_access.devices_plan(str(tmp_path / "nodev"), str(drv))
    with pytest.raises(Exception, match="no libcuda.so.1"):
        gpu_access.devices_plan(str(dev), str(sysdir / "nothing"))
    with pytest.raises(Exception, match="libcuda.so.1 was not found"):
        gpu_access.devices_plan(str(dev), lib_dirs=(str(tmp_path / "nothing"),))


def test_host_quirks_are_detected_from_the_host(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text("cgroup /sys/fs/cgroup/cpu cgroup rw 0 0\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n")
    assert engines.cgroup_layout(str(mounts)) == "hybrid"
    mounts.write_text("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n")
    assert engines.cgroup_layout(str(mounts)) == "v2"
    status = tmp_path / "status"
    status.write_text("CapEff:\t000001fffeffffff\nCapBnd:\t000001ffffffffff\n")
    assert not engines.has_capability(24, status_file=str(status))
    assert engines.has_capability(21, status_file=str(status))
    assert engines.has_capability(24, "CapBnd", str(status))
    assert engines.local_docker_daemon([]) == (os.environ.get("DOCKER_HOST", "unix://").startswith("unix://"))
    assert not engines.local_docker_daemon(["-H", "tcp://gpu-node:2375"])
    assert not engines.local_docker_daemon(["--context", "remote"])
    assert engines.local_docker_daemon(["--host=unix:///run/user/1000/docker.sock"]) == engines.local_docker_daemon([])
    args = engines.rlimit_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert args[:2] == ["--ulimit", f"nofile={soft}:{hard}"]
    n = int(args[3].split("=")[1].split(":")[0])
    nproc_hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    assert n <= (engines.pid_max() or n) and (nproc_hard == resource.RLIM_INFINITY or n <= nproc_hard)


@pytest.mark.parametrize("name", ["host-vs-container", "host-vs-container-fp32", "host-vs-container-2gpu",
                                  "container-options", "startup"])
def test_shipped_experiment_files_name_only_known_settings(name, tmp_path):
    f = yaml.safe_load((ROOT / "experiments" / f"{name}.yaml").read_text())
    workload = workloads.get(f["workload"])
    known = set(SPEC_FIELDS) | set(option_keys()) | {"env"} | {p.name for p in workload.params}
    top = set(f) - {"name", "workload", "params", "trials", "margin", "arms"}
    assert top <= known, top - known
    assert f["trials"] >= (10 if name == "startup" else 5) and len(f["arms"]) >= 2
    params = dict(f["params"], **({"data_dir": str(tmp_path)} if "data_dir" in f["params"] else {}))
    workload.validate(params, "cuda")
    kinds = set()
    for arm in f["arms"]:
        assert set(arm) - {"name"} <= known, arm
        kinds.add(arm.get("env", f.get("env")))
        opts = {k: v for k, v in {**f, **arm}.items() if k in option_keys()}
        if arm.get("env", f.get("env")) == "container":
            assert opts.get("rootfs") == "/:O" or opts.get("image")
    assert kinds == ({"container"} if name == "container-options" else {"host", "container"})


def test_dataloader_workers_out_of_shared_memory_is_one_plain_line(cli, tmp_path):
    # the engines' small /dev/shm against DataLoader workers: the cause and the fix, not a child's traceback
    from PIL import Image
    import numpy as np

    rng = np.random.default_rng(0)
    data = tmp_path / "data"
    for cls in ("a", "b"):
        (data / cls).mkdir(parents=True)
        for i in range(8):
            Image.fromarray(rng.integers(0, 255, (144, 144, 3), dtype=np.uint8)).save(data / cls / f"{i}.png")
    # one batch (8 x 3 x 128 x 128 float32 = 1.5 MiB) cannot fit in the 1 MiB /dev/shm, whatever torch's sharing
    # strategy (64-pixel batches of 0.4 MiB sometimes fit, and the run succeeded)
    r = cli("run", "cnn-train", "--env", "container", "--rootfs", "/:O", "--shm-size", "1m", "--model", "resnet18",
            "--batch-size", "8", "--image-size", "128", "--steps", "3", "--warmup-steps", "1", "--data-dir", data,
            "--mount", f"{data}:{data}:ro", "--workers", "2", "--num-classes", "2", "--device", "cpu")
    assert r.returncode == 1, r.stdout + r.stderr
    err = sqlite3.connect(tmp_path / "gpuvs.db").execute("SELECT error, error_kind FROM trials").fetchone()
    assert err[1] == "oom" and "\n" not in err[0] and "Traceback" not in err[0]
    assert err[0].startswith("out of shared memory (/dev/shm: 1 MiB) in the DataLoader workers (2 workers, batch "
                             "size 8): raise --shm-size (1g or more) or lower --workers or --batch-size; "), err[0]


def test_an_error_re_raised_from_a_child_names_where_and_its_cause():
    from gpuvs.probes.failures import classify

    text = ("Caught ValueError in DataLoader worker process 1.\nOriginal Traceback (most recent call last):\n"
            '  File "x.py", line 1, in f\n    g()\nValueError: image 17 is truncated\n')
    spec = RunSpec(workload="cnn-train", device="cpu", params={"workers": 4, "batch_size": 32})
    assert classify(ValueError(text), spec) == (
        "crash", "ValueError (ValueError in DataLoader worker process 1): ValueError: image 17 is truncated")
    oom = text.replace("ValueError: image 17 is truncated", "RuntimeError: DefaultCPUAllocator: can't allocate memory")
    assert classify(RuntimeError(oom), spec) == (
        "oom", "RuntimeError (ValueError in DataLoader worker process 1): RuntimeError: DefaultCPUAllocator: "
               "can't allocate memory")
    assert classify(KeyError("fshm: No space left on device"), spec)[0] == "crash"  # not every full disk is /dev/shm
    bus = ("DataLoader worker (pid 4242) is killed by signal: Bus error. It is possible that dataloader's workers "
           "are out of shared memory. Please try to raise your shared memory limit.")
    kind, message = classify(RuntimeError(bus), spec)  # on the host (no container): no --shm-size to give
    assert kind == "oom" and message.startswith("out of shared memory (/dev/shm: ")
    assert "(4 workers, batch size 32): free or enlarge /dev/shm or lower --workers or --batch-size; DataLoader" \
        in message
