"""What a command's arms actually ran (docs/command.md, "What ran"), for real.

A host arm whose `python3` differs from a container's: the warning in every format, and `compare --strict` refusing.
The same program in both arms gives no warning; `python3 s.py` runs in a container without --workdir.
A bare container's executable is read from outside, and a container that cannot see this folder says so."""

import hashlib
import json
import os
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import SRC, gpuvs_processes, require
from images import binaries_rootfs, import_image, podman

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # a --rootfs container's PATH
SCRIPT = "import sys\nprint('rate: 100.0', flush=True)\n"
RATE = "rate=rate: ([0-9.]+),rate"


def sha(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def tools():
    require("podman", "podman (.ci/apt/containers.txt)")
    require("python3", "python3")


@pytest.fixture(autouse=True)
def nothing_left_behind():
    yield
    assert gpuvs_processes() == []
    r = podman("ps", "-a", "--filter", "label=gpuvs", "--format", "{{.Names}}")
    assert r.returncode == 0 and r.stdout.split() == [], r.stdout


def exp_id(stdout: str) -> str:
    return [ln for ln in stdout.splitlines() if ln.startswith("experiment ")][-1].split()[1]


def flat(text: str) -> str:
    return " ".join(text.split())


def container_python() -> str:
    """The python3 a --rootfs /:O container runs from its default PATH."""
    for folder in DEFAULT_PATH.split(":"):
        if os.access(os.path.join(folder, "python3"), os.X_OK):
            return os.path.join(folder, "python3")
    pytest.fail("no python3 on the default PATH of this machine")


def another_python(folder: Path) -> Path:
    """A `python3` that is another program than the container's: the Python running these tests where it is another
    file (a venv's, pyenv's), else a wrapper script around the container's."""
    folder.mkdir()
    theirs = container_python()
    ours = os.path.realpath(sys.executable)
    link = folder / "python3"
    if sha(ours) != sha(theirs):
        link.symlink_to(ours)
    else:
        link.write_text(f'#!/bin/sh\nexec {theirs} "$@"\n')
        link.chmod(0o755)
    return link


def test_two_pythons_warn_beside_the_verdict_and_strict_refuses_keeping_every_trial(cli, tmp_path, tools):
    (tmp_path / "s.py").write_text(SCRIPT)
    ours = another_python(tmp_path / "bin")
    arms = ["--arm", "host:env=host",
            "--arm", f"ctr:env=container,engine=podman,rootfs=/:O,mount={tmp_path}:{tmp_path}"]
    r = cli("compare", "command", "--device", "cpu", "--trials", "2", "--metric", RATE, "--strict", *arms, "--",
            "python3", "s.py", PATH=f"{ours.parent}:{DEFAULT_PATH}")
    # no verdict: one line, exit status 1
    assert r.returncode == 1, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("gpuvs: error: no verdict (--strict): arms ran different programs: "
                           f"host ran {ours} "), line
    assert f"ctr ran {container_python()}" in line and "Verdict" not in r.stdout
    ident = line.rsplit("gpuvs results show ", 1)[1].rstrip(")")
    # what was measured is stored: every trial, each with what it ran
    db = sqlite3.connect(tmp_path / "gpuvs.db")
    rows = db.execute("SELECT arm, status, config FROM trials WHERE experiment_id = ?", (ident,)).fetchall()
    assert sorted((a, s) for a, s, _ in rows) == [("ctr", "ok"), ("ctr", "ok"), ("host", "ok"), ("host", "ok")]
    ran = {a: json.loads(c)["program"] for a, _, c in rows}
    assert ran["host"]["executable"]["path"] == str(ours)
    assert ran["host"]["executable"]["sha256"] == sha(str(ours))
    assert ran["ctr"]["executable"]["path"] == container_python()
    assert ran["ctr"]["executable"]["sha256"] == sha(container_python())
    assert ran["ctr"]["version"].startswith("Python 3.")
    assert ran["host"]["workdir"] == ran["ctr"]["workdir"] == str(tmp_path)  # no --workdir: the same folder
    assert ran["host"]["script"]["sha256"] == ran["ctr"]["script"]["sha256"] == sha(str(tmp_path / "s.py"))
    # the warning beside the verdict, in every format
    r = cli("compare", "--stored", f"{ident}:host", f"{ident}:ctr")
    assert r.returncode == 0, r.stderr
    lines = flat(r.stdout)
    assert f"warning: arms ran different programs: host ran {ours} " in lines, r.stdout  # short names (the arms)
    assert lines.index("warning: arms ran different programs") < lines.index("Verdict")  # beside the verdict
    for fmt in ("terminal", "markdown", "html"):
        r = cli("report", ident, "--format", fmt)
        assert r.returncode == 0, r.stderr
        assert f"arms ran different programs: host ran {ours} " in flat(r.stdout), (fmt, r.stdout)
    r = cli("report", ident, "--format", "json")
    programs = json.loads(r.stdout)["programs"]
    assert programs["unasked"] is True and programs["differ"] == ["ctr"] and programs["workdirs"] == []
    r = cli("compare", "--stored", f"{ident}:host", f"{ident}:ctr", "--strict")
    assert r.returncode == 1 and "no verdict (--strict)" in r.stderr and "Verdict" not in r.stdout


def test_the_same_program_gives_no_warning_and_a_relative_script_runs_in_both_arms_without_workdir(tools):
    # a folder of the repository's file system: a --rootfs /:O container sees it at the same path, no mount needed
    # (where it is on another file system, the container cannot: then it is mounted in, at the same path)
    folder = Path(tempfile.mkdtemp(prefix=".gpuvs-test-workdir-", dir=SRC.parent))
    try:
        (folder / "s.py").write_text(SCRIPT)
        mount = [] if os.stat(folder).st_dev == os.stat("/").st_dev else [f",mount={folder}:{folder}"]
        from conftest import run_cli

        r = run_cli("compare", "command", "--device", "cpu", "--trials", "2", "--metric", RATE, "--strict",
                    "--store", folder / "gpuvs.db", "--arm", "host:env=host",
                    "--arm", "ctr:env=container,engine=podman,rootfs=/:O" + "".join(mount), "--", "python3", "s.py",
                    cwd=folder, PATH=DEFAULT_PATH)
        # --strict also refuses a contended machine (CI runs other tests beside this one): that is no program's doing
        assert r.returncode == 0 or "no verdict (--strict): the machine was contended" in r.stderr, \
            r.stdout[-3000:] + r.stderr
        assert "ran different programs" not in r.stdout + r.stderr and "working directories" not in r.stdout
        assert "cannot see this folder" not in r.stdout
        ident = next(ln.split()[3] for ln in r.stdout.splitlines() if ln.startswith("stored as experiment"))
        r = run_cli("report", ident, "--format", "json", "--store", folder / "gpuvs.db", cwd=folder)
        programs = json.loads(r.stdout)["programs"]
        assert programs["differ"] == [] and programs["unasked"] is False and programs["workdirs"] == []
        (host, ctr) = (a["program"] for a in programs["arms"])
        assert host["workdir"] == ctr["workdir"] == str(folder)
        assert host["executable"]["sha256"] == ctr["executable"]["sha256"] and host["version"] == ctr["version"]
    finally:
        shutil.rmtree(folder)


@pytest.fixture(scope="module")
def nopython(tools, tmp_path_factory):
    require("sysbench", "sysbench (apt-get install sysbench: .ci/apt/command.txt)")
    folder = tmp_path_factory.mktemp("image")
    root = binaries_rootfs(folder / "root", ("sysbench",))
    tag = import_image(root, f"localhost/gpuvs-prog-nopython:{os.getpid()}", folder / "image.tar")
    yield tag
    podman("rmi", "-f", tag)


def test_a_bare_containers_program_is_read_from_outside_and_a_folder_it_cannot_see_is_said(cli, nopython):
    r = cli("compare", "command", "--device", "cpu", "--trials", "1", "--bare", "--parser", "sysbench",
            "--arm", "host:env=host", "--arm", f"ctr:env=container,engine=podman,image={nopython}",
            "--", "sysbench", "cpu", "--time=1", "run")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    out = flat(r.stdout)
    # said loudly in the run's output: the image cannot see this folder
    assert f"warning: the container (image {nopython}) cannot see this folder (" in out, r.stdout
    assert "give --workdir DIR" in out
    data = json.loads(cli("report", exp_id(r.stdout), "--format", "json").stdout)
    (host, ctr) = (a["program"] for a in data["programs"]["arms"])
    # the same sysbench binary (the image holds this machine's): the same program, read inside the stopped container
    assert ctr["executable"]["path"] == shutil.which("sysbench") and ctr["version"] is None  # bare: no --version
    assert ctr["executable"]["sha256"] == host["executable"]["sha256"] == sha(shutil.which("sysbench"))
    assert host["version"].startswith("sysbench ")
    assert data["programs"]["differ"] == [] and ctr["workdir"] == "/"
    assert "warning: arms started in different working directories: host in " in out and "ctr in /;" in out


def test_a_users_own_program_is_never_run_again_for_its_version(tmp_path):
    """`EXE --version` is asked only of interpreters and known tools: a user's script given --version might simply
    run again, with its side effects. Its hash tells it apart; python3's version is still read."""
    from gpuvs.probes import program

    marker = tmp_path / "ran"
    job = tmp_path / "train.sh"
    job.write_text(f"#!/bin/sh\necho ran >> {marker}\necho 'train 1.0'\n")
    job.chmod(0o755)
    got = program.describe([str(job)], str(tmp_path), dict(os.environ))
    assert "version" not in got and not marker.exists(), got
    assert got["executable"]["sha256"] == hashlib.sha256(job.read_bytes()).hexdigest()
    got = program.describe([sys.executable, str(job)], str(tmp_path), dict(os.environ))
    assert got["version"].startswith("Python 3.") and got["script"]["path"] == str(job) and not marker.exists()
