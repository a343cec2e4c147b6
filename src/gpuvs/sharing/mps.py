"""The CUDA MPS control daemon, managed by gpuvs: private pipe and log folders, a check that clients
attached, and a stop on every path. It never changes the GPU's compute mode or any other setting,
and refuses to start where another MPS daemon is already running."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from gpuvs.errors import EnvironmentUnavailable

BINARY = "nvidia-cuda-mps-control"
SEARCH = ("/usr/local/nvidia/bin", "/usr/bin", "/usr/local/cuda/bin")


def find_binary() -> str | None:
    found = shutil.which(BINARY)
    if found:
        return found
    for folder in SEARCH:
        candidate = Path(folder) / BINARY
        if candidate.exists():
            return str(candidate)
    return None


def mps_processes(pipe_dir: str | None = None) -> list[int]:
    """PIDs of MPS control daemons and servers; with pipe_dir, only those serving that pipe folder."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if (d / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue  # a zombie left for a parent that does not reap: not running
            comm = (d / "comm").read_text().strip()
            if comm not in ("nvidia-cuda-mps", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server") and \
                    not comm.startswith("nvidia-cuda-mps"):
                continue
            if pipe_dir is not None:
                raw = (d / "environ").read_bytes()
                # an empty environment is a process on its way out (its memory already released): it may be
                # ours, so it counts until it has gone
                if raw and f"CUDA_MPS_PIPE_DIRECTORY={pipe_dir}".encode() not in raw.split(b"\0"):
                    continue
        except OSError:
            continue
        out.append(int(d.name))
    return out


def reap_exited_children(wait_s: float = 2.0) -> list[int]:
    """`nvidia-cuda-mps-control -d` daemonises: its processes are re-parented to the nearest sub-reaper, which
    is gpuvs itself where it runs as PID 1 (in a container or pod) or under a supervisor that made it one. Such
    a parent must wait for them, or they stay behind as zombies. Reaps the exited MPS children of this
    process (waiting up to wait_s for ones still ending), never another child whose status a Popen awaits;
    returns their PIDs."""
    reaped: list[int] = []
    me = str(os.getpid())
    deadline = time.monotonic() + wait_s
    while True:
        pending = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            comm, fields = stat.split("(", 1)[1].rsplit(")", 1)[0], stat.rsplit(")", 1)[1].split()
            if fields[1] == me and fields[0] == "Z" and comm.startswith("nvidia-cuda-mps"):
                pending.append(int(d.name))
        for pid in pending:
            try:
                os.waitpid(pid, os.WNOHANG)
                reaped.append(pid)
            except ChildProcessError:
                pass
        if not pending or time.monotonic() > deadline:
            return reaped
        time.sleep(0.05)


class MpsDaemon:
    """with MpsDaemon() as mps: ... workers get mps.client_env() ... (stopped on exit, whatever happens)."""

    def __init__(self, binary: str | None = None):
        self.binary = binary or find_binary()
        if self.binary is None:
            raise EnvironmentUnavailable(f"MPS asked for, but {BINARY} is not installed here (it comes with the "
                                         "NVIDIA driver); use --mps off")
        self.root: str | None = None
        self.started = False

    @property
    def pipe_dir(self) -> str:
        assert self.root
        return os.path.join(self.root, "pipe")

    @property
    def log_dir(self) -> str:
        assert self.root
        return os.path.join(self.root, "log")

    def client_env(self) -> dict[str, str]:
        return {"CUDA_MPS_PIPE_DIRECTORY": self.pipe_dir, "CUDA_MPS_LOG_DIRECTORY": self.log_dir}

    def _env(self) -> dict[str, str]:
        return {**os.environ, **self.client_env()}

    def start(self) -> MpsDaemon:
        others = mps_processes()
        if others:
            raise EnvironmentUnavailable(f"another MPS daemon is already running here (pid {others[0]}); gpuvs will "
                                         "not start a second one or touch it: stop it, or use --mps off")
        self.root = tempfile.mkdtemp(prefix="gpuvs-mps-")
        os.makedirs(self.pipe_dir)
        os.makedirs(self.log_dir)
        proc = subprocess.run([self.binary, "-d"], env=self._env(), capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            self._cleanup_dirs()
            raise EnvironmentUnavailable(f"{BINARY} -d failed (status {proc.returncode}): "
                                         f"{(proc.stderr or proc.stdout).strip()[:200]}")
        self.started = True
        deadline = time.monotonic() + 10
        while not mps_processes(self.pipe_dir) and time.monotonic() < deadline:
            time.sleep(0.05)
        return self

    def query(self, command: str, timeout: float = 10.0) -> str:
        proc = subprocess.run([self.binary], input=command + "\n", env=self._env(), capture_output=True, text=True,
                              timeout=timeout)
        return proc.stdout.strip()

    def servers(self) -> list[int]:
        return [int(p) for p in self.query("get_server_list").split() if p.isdigit()]

    def clients(self) -> int:
        """Client processes attached to this daemon's servers right now."""
        return sum(len([p for p in self.query(f"get_client_list {s}").split() if p.isdigit()])
                   for s in self.servers())

    def stop(self) -> None:
        if not self.started:
            self._cleanup_dirs()
            return
        self.started = False
        try:
            self.query("quit", timeout=15)
        except (subprocess.TimeoutExpired, OSError):
            pass
        deadline = time.monotonic() + 15
        while mps_processes(self.pipe_dir) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in mps_processes(self.pipe_dir):  # what did not quit in time
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        reap_exited_children()
        self._cleanup_dirs()

    def _cleanup_dirs(self) -> None:
        if self.root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> MpsDaemon:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
