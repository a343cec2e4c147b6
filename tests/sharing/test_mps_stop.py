"""gpuvs's MPS daemon stop leaves no zombie (issue 37), on the CPU.

A stand-in `nvidia-cuda-mps-control` daemonises as the real one does, and lingers until `quit` on its pipe folder.
It runs under a child subreaper, as gpuvs is as PID 1 of a container: re-parented to gpuvs, which must wait for it.
The real daemon on a GPU: tests/sharing/test_gpu.py."""

import os
import signal
import subprocess
import sys

from conftest import CHILDREN_LEFT, gpuvs_env
from gpuvs.sharing import mps

STAND_IN = r"""#!{python}
import os, sys, time
pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
if sys.argv[1:] == ["-d"]:
    if os.fork():
        os._exit(0)  # the parent returns at once, as `nvidia-cuda-mps-control -d` does
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # a daemon lets go of its caller's pipes
        os.dup2(null, fd)
    open(os.path.join(pipe, "control"), "w").write(str(os.getpid()))
    while not os.path.exists(os.path.join(pipe, "quit")):
        time.sleep(0.02)
    time.sleep(0.3)  # lingers a moment after quit, then exits
    os._exit(0)
for line in sys.stdin:
    if line.strip() == "quit":
        open(os.path.join(pipe, "quit"), "w").close()
    # get_server_list and the others: no servers
"""

PARENT = r"""
import ctypes, os, sys
from gpuvs.sharing import mps
assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
daemon = mps.MpsDaemon()
print("binary", daemon.binary)
with daemon:
    pid = int(open(os.path.join(daemon.pipe_dir, "control")).read())
    print("daemon", pid, "parent", open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
""" + CHILDREN_LEFT


def test_the_mps_daemon_stop_leaves_no_zombie_under_a_subreaper_parent(tmp_path):
    fake = tmp_path / "bin" / mps.BINARY
    fake.parent.mkdir()
    fake.write_text(STAND_IN.format(python=sys.executable))
    fake.chmod(0o755)
    env = gpuvs_env(PATH=f"{fake.parent}:{gpuvs_env()['PATH']}")
    try:
        r = subprocess.run([sys.executable, "-c", PARENT], capture_output=True, text=True, timeout=60, env=env)
    finally:
        for pid in mps.mps_processes():  # a stand-in left by a failure here: this test's own, by its path
            try:
                if str(fake).encode() in open(f"/proc/{pid}/cmdline", "rb").read():
                    os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    out = r.stdout + r.stderr
    assert f"binary {fake}" in out  # found by find_binary, as the real one would be
    assert "daemon " in out, out
    parent = out.split("daemon ")[1].split()
    assert parent[1] == "parent" and int(parent[2]) != 1, out  # re-parented to the subreaper, not init
    assert r.returncode == 0 and "children []" in out, out
    assert mps.mps_processes() == []  # and the stand-in daemon has gone
