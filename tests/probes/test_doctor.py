"""gpuvs doctor (issue 45, item 8): a torchvision that cannot load its operators fails, with the line that mends it.

A /dev/shm under 1 GiB is a warning with the reason and the fix.
What would disturb a measurement here is named, read only: load, CPU pressure, the CPU governor, GPU processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from conftest import SRC, TEST_TAG, gpuvs_env, missing_part, run_cli, wait_for


def _flat(text: str) -> str:
    return " ".join(text.split())


def _broken_torchvision(tmp_path):
    """A copy of this venv's torchvision without its operator library: what a torchvision built for another torch
    gives (its Python loads, its C++ operators do not)."""
    try:
        import torchvision  # noqa: F401
    except Exception:
        missing_part("torchvision is needed (installed and working) to make a broken copy of it")
    source = os.path.dirname(sys.modules["torchvision"].__file__)
    shutil.copytree(source, tmp_path / "tv" / "torchvision", ignore=shutil.ignore_patterns("_C*.so", "__pycache__"))
    return tmp_path / "tv"


def test_a_torchvision_without_its_operators_fails_with_the_fix(tmp_path):
    import torch

    ok = run_cli("doctor", "--env", "host", "--device", "cpu")
    assert "torchvision │ ok" in _flat(ok.stdout), ok.stdout + ok.stderr
    broken = _broken_torchvision(tmp_path)
    r = run_cli("doctor", "--env", "host", "--device", "cpu", PYTHONPATH=f"{SRC}{os.pathsep}{broken}")
    flat = _flat(r.stdout)
    assert r.returncode != 0 and "all checks passed" not in flat, r.stdout
    assert "torchvision │ FAIL │ installed but cannot be loaded (RuntimeError: operator torchvision::nms does not " \
           "exist)" in flat, flat
    major, minor = torch.__version__.split(".")[:2]
    fix = f"pip install 'torchvision==0.{15 + int(minor)}.*' (the release matching torch {major}.{minor})"
    assert fix in r.stderr and r.stderr.count("gpuvs: error:") == 1 and "Traceback" not in r.stderr, r.stderr


def _in_own_mount(script: str):
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True) if shutil.which("unshare") else None
    if probe is None or probe.returncode != 0 or shutil.which("mount") is None:
        missing_part("a mount namespace of its own (unshare -m, as root) is needed to mount a small /dev/shm")
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], capture_output=True,
                          text=True, timeout=300, env=gpuvs_env())


def test_a_small_dev_shm_is_a_warning_with_the_reason_and_the_fix():
    doctor = f"{sys.executable} -m gpuvs doctor --env host --device cpu"
    r = _in_own_mount(f"mount -t tmpfs -o size=62m tmpfs /dev/shm && {doctor}")
    flat = _flat(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "/dev/shm │ warn │ 62 MiB, under 1 GiB: PyTorch's DataLoader workers and NCCL keep their buffers there" \
           in flat, flat
    assert "--shm-size 1g" in flat and "emptyDir with medium: Memory" in flat
    assert "warning(s) above: /dev/shm" in flat
    r = _in_own_mount(f"mount -t tmpfs -o size=2g tmpfs /dev/shm && {doctor}")
    assert r.returncode == 0 and "/dev/shm 2048 MiB" in _flat(r.stdout) and "/dev/shm │ warn" not in _flat(r.stdout)


def test_a_busy_machine_is_named_by_doctor():
    """Real CPU burners: doctor names the CPU pressure (PSI) as what would disturb a measurement now."""
    if not os.path.exists("/proc/pressure/cpu"):
        missing_part("PSI (/proc/pressure/cpu) is needed to see CPU pressure")
    usable = len(os.sched_getaffinity(0))
    env = dict(os.environ, GPUVS_TEST_TAG=TEST_TAG)
    # niced: they keep a task waiting for a CPU all the time (the pressure is real), yet doctor's own probe runs
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"], env=env, preexec_fn=lambda: os.nice(19))
               for _ in range(2 * usable + 1)]

    def pressure() -> float:
        some = open("/proc/pressure/cpu").read().splitlines()[0]
        return float(some.split("avg10=")[1].split()[0]) / 100

    try:
        wait_for(lambda: pressure() > 0.5, 90, "the burners to raise CPU pressure")
        r = run_cli("doctor", "--env", "host", "--device", "cpu")
    finally:
        for p in burners:
            p.kill()
        for p in burners:
            p.wait()
    flat = _flat(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "CPU pressure │ warn │ some task waited for a CPU" in flat and "above 20%: a trial now would be " \
           "contended" in flat, flat
    assert "machine load │" in flat and "CPU governor │" in flat


def test_the_machine_rows_follow_the_rule():
    sys.path.insert(0, str(SRC))
    from gpuvs.probes import checkup

    def rows(machine, cuda=True):
        report = checkup.Report()
        checkup.machine_checks(machine, report, cuda)
        return {r.check: (r.status, r.detail) for r in report.rows}

    quiet = rows({"load": 0.5, "cpus_usable": 2.0, "cpu_pressure_avg10": 0.02, "governors": ["performance"],
                  "gpu_processes": []})
    assert quiet == {"machine load": ("ok", "1-minute load 0.5 on 2 usable CPUs"),
                     "CPU pressure": ("ok", "some task waited for a CPU 2% of the last 10 s (PSI)"),
                     "CPU governor": ("ok", "performance"), "other GPU processes": ("ok", "none")}
    busy = rows({"load": 5.1, "cpus_usable": 2.0, "cpu_pressure_avg10": 0.43, "governors": ["powersave"],
                 "gpu_processes": [{"pid": 1234, "name": "python", "gpu": 0, "mem_mib": 2048}]})
    assert {k: v[0] for k, v in busy.items()} == {"machine load": "warn", "CPU pressure": "warn",
                                                  "CPU governor": "warn", "other GPU processes": "warn"}
    assert busy["other GPU processes"][1].startswith("pid 1234 (python) on GPU 0, 2,048 MiB: a trial beside them")
    assert "cpupower frequency-set -g performance" in busy["CPU governor"][1]
    assert "other GPU processes" not in rows({"load": 0.1, "cpus_usable": 2.0, "gpu_processes": []}, cuda=False)
