"""The command workload for real (docs/command.md): sysbench on the host and in real podman containers.

Wrapped by gpuvs's worker, and bare: an image with no Python, built here from this machine's sysbench (no pull).
Runs are short (sysbench --time=1, at most three trials an arm): a few seconds each on two shared cores.
The pod arm is in tests/workloads/test_command_cluster.py."""

import json
import re
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid

import pytest

from conftest import gpuvs_env, gpuvs_processes, require
from images import binaries_rootfs, import_image, podman

SYSBENCH = ["sysbench", "cpu", "--time=1", "run"]


def gpuvs_containers():
    r = podman("ps", "-a", "--filter", "label=gpuvs", "--format", "{{.Names}}")
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


@pytest.fixture(scope="module")
def tools():
    require("sysbench", "sysbench (apt-get install sysbench: .ci/apt/command.txt)")
    require("podman", "podman (.ci/apt/containers.txt)")


@pytest.fixture(scope="module")
def nopython(tools, tmp_path_factory):
    """An image with sysbench and its libraries only: no Python, no shell (a compiled benchmark's)."""
    folder = tmp_path_factory.mktemp("image")
    root = binaries_rootfs(folder / "root", ("sysbench",))
    assert not any((root / p).exists() for p in ("usr/bin/python3", "bin/sh", "usr/bin/sh"))  # no Python, no shell
    tag = import_image(root, f"localhost/gpuvs-cmd-nopython:{uuid.uuid4().hex[:8]}", folder / "image.tar")
    yield tag
    podman("rmi", "-f", tag)


def cuda_image(base: str, cuda: str, folder) -> str:
    """`base` with a CUDA toolkit's version file (what software.py reads), as a new layer built locally."""
    folder.mkdir()
    (folder / "version.json").write_text(json.dumps({"cuda": {"name": "CUDA SDK", "version": cuda}}))
    (folder / "Containerfile").write_text(f"FROM {base}\nCOPY version.json /usr/local/cuda/version.json\n")
    tag = f"{base}-cuda{cuda}"
    r = podman("build", "--pull=never", "-t", tag, str(folder))
    assert r.returncode == 0, r.stderr
    return tag


@pytest.fixture(autouse=True)
def nothing_left_behind():
    yield
    assert gpuvs_processes() == []
    if os.path.exists("/usr/bin/podman") or os.path.exists("/usr/local/bin/podman"):
        assert gpuvs_containers() == []


def report(cli, ident: str) -> dict:
    r = cli("report", ident, "--format", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def exp_id(stdout: str) -> str:
    return [ln for ln in stdout.splitlines() if ln.startswith("experiment ")][-1].split()[1]


def trials(tmp_path) -> list[dict]:
    db = sqlite3.connect(tmp_path / "gpuvs.db")
    db.row_factory = sqlite3.Row
    out = []
    for row in db.execute("SELECT * FROM trials ORDER BY id"):
        out.append({k: (json.loads(row[k]) if k in ("config", "fingerprint", "summary") and row[k] else row[k])
                    for k in row.keys()})
    return out


# -- bad input: one line, exit 2, before anything starts ---------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--"], "the command is empty"),
    (["--metric", "x=([0-9,higher", "--", "true"], "the regex '([0-9' does not compile"),
    (["--metric", "x=speed [0-9]+,higher", "--", "true"], "has no group for the figure"),
    (["--parser", "nope", "--", "true"], "unknown parser 'nope'; known parsers: hyperfine, jsonl"),
    (["--metric", "x=speed ([0-9]+)", "--", "true"], "no direction: end it with ,higher or ,lower"),
    (["--step-metric", "x=speed ([0-9]+),faster", "--", "true"], "unknown direction 'faster'"),
    (["--", "gpuvs-no-such-program"], "the command's executable 'gpuvs-no-such-program' is not on this host's PATH"),
    (["--", "./not-here.sh"], "the command's executable ./not-here.sh is not an executable file here"),
    (["--bare", "--fresh", "fork", "--", "true"], "--bare runs the command as the environment's own process"),
])
def test_bad_input_is_one_line_and_exit_2_before_anything_starts(cli, tmp_path, args, message):
    r = cli("run", "command", "--device", "cpu", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "gpuvs.db").exists()  # nothing started, nothing stored


def test_bad_input_in_an_arm_or_a_file_is_refused_the_same_way(cli, tmp_path):
    r = cli("compare", "command", "--device", "cpu", "--arm", "a:", "--arm", "b:argv=gpuvs-no-such-program",
            "--", "true")
    assert r.returncode == 2 and "'gpuvs-no-such-program' is not on this host's PATH" in r.stderr, r.stderr
    (tmp_path / "e.yaml").write_text("workload: command\ncommand: []\ndevice: cpu\narms:\n  a: {}\n  b: {}\n")
    r = cli("compare", "--file", "e.yaml")
    assert r.returncode == 2 and "the command is empty" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "gpuvs.db").exists()


def test_an_arms_argv_is_cut_at_commas_then_split_into_words_as_a_shell_would_and_run_without_one(cli, tmp_path):
    """docs/command.md's rule: an --arm is cut at every comma, quotes or not; argv= is then split by shlex."""
    r = cli("compare", "command", "--device", "cpu", "--trials", "1", "--arm", "a:", "--arm",
            "b:argv=sh -c 'echo a,b'", "--", "true")
    assert r.returncode == 2 and "got \"b'\"; an --arm is cut at every comma, quotes or not" in r.stderr, r.stderr
    assert "argv: [sh, -c, 'echo a,b']" in r.stderr and not (tmp_path / "gpuvs.db").exists()
    argv = "python3 -c 'import sys; print(sys.argv[1:])' 'run two' $HOME"
    r = cli("compare", "command", "--device", "cpu", "--trials", "1", "--arm", "a:", "--arm", f"b:argv={argv}",
            "--quiet", "--", "true")
    assert r.returncode == 0, r.stderr
    (b,) = [t for t in trials(tmp_path) if t["arm"] == "b"]
    assert json.loads(b["spec"])["params"]["argv"] == ["python3", "-c", "import sys; print(sys.argv[1:])",
                                                      "run two", "$HOME"]
    log = cli("results", "show", str(b["id"]), "--log").stdout
    assert "['run two', '$HOME']" in log  # the words as split, no shell between: $HOME stays as written


# -- a trial's fate, and its stored output ---------------------------------------------------------------------

def test_each_fate_is_a_failed_trial_with_its_reason_and_the_log_shows_the_output(cli, tmp_path):
    r = cli("run", "command", "--device", "cpu", "--trials", "1", "--", "sh", "-c", "echo start; echo oops >&2; exit 3")
    assert r.returncode != 0
    r = cli("run", "command", "--device", "cpu", "--trials", "1", "--metric", "speed=speed: ([0-9.]+),rate",
            "--", "sh", "-c", "echo warming up; echo no figure today")
    assert r.returncode != 0
    r = cli("run", "command", "--device", "cpu", "--trials", "1", "--timeout", "2", "--", "sh", "-c",
            "echo sleeping; sleep 120 & sleep 121")
    assert r.returncode != 0
    big = 200_000
    r = cli("run", "command", "--device", "cpu", "--trials", "1", "--", "sh", "-c",
            f"yes 0123456789abcde | head -c {big}; echo; echo the end")
    assert r.returncode == 0, r.stderr
    t = trials(tmp_path)
    assert [x["status"] for x in t] == ["failed", "failed", "failed", "ok"]
    # the last lines in the order they arrived: two threads read the two streams, so either may come first
    assert t[0]["error"] in ("the command exited with status 3; last lines: stdout: start | stderr: oops",
                             "the command exited with status 3; last lines: stderr: oops | stdout: start")
    assert t[1]["error"] == ("metric speed (regex 'speed: ([0-9.]+)') never appeared; last lines: stdout: warming up "
                             "| stdout: no figure today")
    assert t[2]["error"].startswith("timed out after 2 s")

    r = cli("results", "show", str(t[0]["id"]), "--log")
    assert r.returncode == 0, r.stderr
    assert "first 16 KiB and the last 48 KiB of each stream" in r.stdout
    assert "--- stdout (6 bytes, 1 lines)\nstart\n" in r.stdout and "--- stderr (5 bytes, 1 lines)\noops\n" in r.stdout
    r = cli("results", "show", str(t[2]["id"]), "--log")
    assert "sleeping" in r.stdout and "timed out" in r.stdout  # what a stopped trial printed is kept too
    r = cli("results", "show", str(t[3]["id"]), "--log")
    total = big + len("\nthe end\n")
    cut = total - 16 * 1024 - 48 * 1024
    assert f"--- stdout ({total:,} bytes, " in r.stdout and f"{cut:,} bytes cut" in r.stdout
    assert r.stdout.rstrip().endswith("the end")


def test_an_executable_missing_in_the_image_fails_the_trial_with_that_reason(cli, tmp_path, nopython):
    r = cli("run", "command", "--device", "cpu", "--trials", "1", "--env", "container", "--engine", "podman",
            "--image", nopython, "--bare", "--", "gpuvs-no-such-program")
    assert r.returncode != 0 and "the command could not start in the container" in r.stderr, r.stderr
    (t,) = trials(tmp_path)
    assert t["status"] == "failed" and '"gpuvs-no-such-program": executable file not found' in t["error"], t["error"]
    # wrapped mode in that image: gpuvs's worker needs Python, and says so
    r = cli("run", "command", "--device", "cpu", "--trials", "1", "--env", "container", "--engine", "podman",
            "--image", nopython, "--", *SYSBENCH)
    assert r.returncode != 0 and "has no python3" in r.stderr, r.stderr


# -- stopping: nothing left behind ------------------------------------------------------------------------------

def _marker_processes(marker: str) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if marker.encode() in open(f"/proc/{d}/cmdline", "rb").read():
                    out.append(int(d))
            except OSError:
                pass
    return out


@pytest.mark.parametrize("where", [[], ["--bare"], ["--env", "container", "--engine", "podman", "--rootfs", "/:O"],
                                   ["--env", "container", "--engine", "podman", "--rootfs", "/:O", "--bare"]],
                         ids=["host", "host-bare", "container", "container-bare"])
@pytest.mark.parametrize("how", ["sigterm", "sigint"])
def test_sigterm_and_ctrl_c_end_the_whole_process_tree(tmp_path, tools, where, how):
    marker = f"{time.time() % 1000 + 4000:.6f}"  # a unique sleep duration: its processes are found by it
    proc = subprocess.Popen([sys.executable, "-m", "gpuvs", "run", "command", "--device", "cpu", "--trials", "1",
                             *where, "--", "sh", "-c", f"sleep {marker} & sleep {marker}"],
                            cwd=tmp_path, env=gpuvs_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(_marker_processes(f"sleep\0{marker}")) < 2:
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    deadline = time.monotonic() + 10
    while _marker_processes(f"sleep\0{marker}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _marker_processes(f"sleep\0{marker}") == []
    assert gpuvs_containers() == []


@pytest.mark.parametrize("bare", [False, True], ids=["wrapped", "bare"])
def test_a_timeout_in_a_container_leaves_no_container_and_no_process(cli, tmp_path, tools, bare):
    marker = f"{time.time() % 1000 + 5000:.6f}"
    r = cli("run", "command", "--device", "cpu", "--trials", "1", "--timeout", "3", "--env", "container", "--engine",
            "podman", "--rootfs", "/:O", *(["--bare"] if bare else []), "--", "sh", "-c", f"sleep {marker} & sleep {marker}")
    assert r.returncode != 0 and "timed out after 3 s" in r.stderr, r.stderr
    assert _marker_processes(f"sleep\0{marker}") == [] and gpuvs_containers() == []


# -- bare mode in an image without Python ----------------------------------------------------------------------

def test_bare_mode_in_an_image_without_python_reads_the_real_output_and_says_what_it_could_not_measure(
        cli, tmp_path, nopython):
    r = cli("run", "command", "--device", "cpu", "--trials", "2", "--env", "container", "--engine", "podman",
            "--image", nopython, "--bare", "--parser", "sysbench", "--", *SYSBENCH)
    assert r.returncode == 0, r.stderr
    t = trials(tmp_path)
    assert [x["status"] for x in t] == ["ok", "ok"]
    for x in t:
        s = x["summary"]
        assert list(s)[0] == "events_per_sec" and s["events_per_sec"]["value"] > 0
        assert s["events_per_sec"]["declared"]["up"] == "faster"
        assert 0.9 < s["wall_time_s"]["value"] < 10  # the engine's record: sysbench ran --time=1
        assert "no fingerprint taken inside" in x["config"]["unmeasured"]
        assert "no NVML telemetry" in x["config"]["unmeasured"]
        assert x["config"]["wall_time_clock"].startswith("podman's record of the container")
        assert x["config"]["parser_info"]["sysbench"]["test"] == "cpu"
        fp = x["fingerprint"]
        assert fp["taken_by"].startswith("gpuvs, from outside the container") and fp["container_image"] == nopython
        assert fp["software"]["os"]  # /etc/os-release, copied out of the image without running anything
    r = cli("results", "show", str(t[0]["id"]), "--log")
    assert "events per second:" in r.stdout  # sysbench's own report, as the engine relayed it


# -- verdicts ----------------------------------------------------------------------------------------------------

def test_a_cpu_limit_on_one_arm_is_called_slower_with_its_ratio(cli, nopython):
    r = cli("compare", "command", "--device", "cpu", "--trials", "3", "--env", "container", "--engine", "podman",
            "--image", nopython, "--bare", "--parser", "sysbench", "--arm", "full:", "--arm", "slim:cpus=0.02",
            "--", *SYSBENCH)
    assert r.returncode == 0, r.stderr
    data = report(cli, exp_id(r.stdout))
    (v,) = [v for v in data["verdicts"] if v["metric"] == "events_per_sec"]
    # a fiftieth of a CPU against whatever the machine gives an unlimited one (a tenth of one, with 20 jobs on two cores)
    assert v["arm"] == "slim" and v["verdict"] == "slower", v
    assert v["ratio"] < 0.5 and v["ci_low"] < v["ratio"] < v["ci_high"] < 0.8
    assert re.search(r"slim is [0-9.]+% slower than full \[", " ".join(r.stdout.split())), r.stdout[-3000:]
    flat = " ".join(r.stdout.split())  # what could not be measured inside is said beside the verdict
    assert "arm slim ran bare, so the command is the container's own process" in flat and "no NVML telemetry" in flat


def test_an_a_a_comparison_of_one_command_is_never_called_faster_or_slower(cli):
    # the same command twice: an A/A run (--aa), two arms that run exactly alike. At 95% an interval misses 1 in
    # about 5% of A/A runs, more on a machine whose speed drifts, as CI's does while Kubernetes builds beside the
    # tests (one such run in CI read faster at the default margin). What must never happen is a call beyond a
    # margin wider than the machine's noise (±50%), and the ratio itself lies inside that margin.
    r = cli("compare", "command", "--device", "cpu", "--trials", "3", "--parser", "sysbench", "--aa", "--margin",
            "0.5", "--", *SYSBENCH)
    assert r.returncode == 0, r.stderr
    data = report(cli, exp_id(r.stdout))
    (v,) = [v for v in data["verdicts"] if v["metric"] == "events_per_sec"]
    assert v["verdict"] not in ("faster", "slower"), v
    assert v["ci_low"] <= v["ratio"] <= v["ci_high"] and 0.67 < v["ratio"] < 1.5, v


def test_image_against_image_names_what_the_new_image_changed(cli, tmp_path, nopython):
    v1 = cuda_image(nopython, "12.4.1", tmp_path / "v1")
    v2 = cuda_image(nopython, "12.8.0", tmp_path / "v2")
    try:
        r = cli("compare", "command", "--device", "cpu", "--trials", "2", "--env", "container", "--engine", "podman",
                "--bare", "--parser", "sysbench", "--arm", f"v1:image={v1}", "--arm", f"v2:image={v2}",
                "--", *SYSBENCH)
        assert r.returncode == 0, r.stderr
        flat = " ".join(r.stdout.split())
        assert "arm v2's image differs from arm v1's in software.cuda (12.4.1 vs 12.8.0)" in flat, r.stdout
        data = report(cli, exp_id(r.stdout))
        cuda = {a["name"]: a["fingerprint"]["software"]["cuda"] for a in data["arms"]}
        assert cuda == {"v1": "12.4.1", "v2": "12.8.0"}
        r = cli("report", exp_id(r.stdout))
        assert any("CUDA toolkit (files)" in ln and "12.4.1" in ln and "12.8.0" in ln and "≠" in ln
                   for ln in r.stdout.splitlines()), r.stdout
    finally:
        podman("rmi", "-f", v1, v2)


NO_NUMPY_WORKER = r"""
import json, sys
class NoNumpy:  # the user's image: Python and nothing else
    def find_spec(self, name, path=None, target=None):
        if name == "numpy" or name.startswith("numpy."):
            raise ModuleNotFoundError("No module named 'numpy' (this test's image has none)")
sys.meta_path.insert(0, NoNumpy())
from gpuvs.trial import worker
from gpuvs.spec import RunSpec
spec = RunSpec(workload="command", device="cpu", params={"argv": ["sh", "-c", "echo 'speed: 5'; echo 'speed: 7'"],
               "step_metric": ["speed=speed: ([0-9]+),rate"], "headline": "speed"})
out = []
worker.run_events(spec, out.append)
summary = [e for e in out if e["type"] == "summary"][0]["data"]
print(json.dumps(summary["speed"]))
print("numpy" in sys.modules)
"""


def test_the_wrapped_commands_worker_needs_no_numpy_in_the_image():
    """Wrapped mode needs Python and its standard library only: the command's worker imports no other workload's
    module (the kernel suite's imports numpy) and summarises in plain Python."""
    r = subprocess.run([sys.executable, "-c", NO_NUMPY_WORKER], capture_output=True, text=True, timeout=120,
                       env=gpuvs_env())
    assert r.returncode == 0, r.stderr
    speed, loaded = r.stdout.strip().splitlines()
    speed = json.loads(speed)
    assert speed["n"] == 2 and speed["value"] == 6.0 and speed["declared"]["up"] == "faster" and loaded == "False"
