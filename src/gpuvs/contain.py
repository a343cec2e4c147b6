"""Containment of a command job: nothing the job starts outlives its trial, however it detached or gpuvs ended.

Each job runs under a keeper (keeper_main(), in a Python of its own): a child subreaper, in a cgroup where it can.
The keeper tells its owner the job's pid and exit over a pipe, and ends the tree when asked or when its owner is gone.
What it covers, and what not: docs/command.md ("Stopping"). Standard library only: it runs in an image's Python too."""

from __future__ import annotations

import ctypes
import json
import os
import re
import select
import signal
import subprocess
import sys
import time

ENV = "GPUVS_CGROUP"
MODES = ("auto", "v2", "v1", "off")
PR_SET_CHILD_SUBREAPER = 36
START_TIMEOUT_S = 60.0
END_TIMEOUT_S = 10.0  # the keeper's last SIGKILLs; the owner's own fallback waits a little longer
PREFIX = "gpuvs-trial-"
# the keeper's command: this module found where this process found it (a folder, or the zip a pod mounts)
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEEPER = "import os, sys; sys.path.insert(0, sys.argv[1]); from gpuvs.contain import keeper_main; " \
         "os._exit(keeper_main(sys.argv[2:]))"


# -- the owner's side -------------------------------------------------------------------------------------------------

def cgroup_mode() -> str:
    return os.environ.get(ENV, "").strip().lower() or "auto"


class Contained:
    """A job started under a keeper, as much like subprocess.Popen as its callers need: `pid` (the job's), `stdout`
    and `stderr` (pipes, when asked for), `returncode`, poll(), wait(); and stop(grace_s) / close(), which return
    once the job's whole tree has ended. `containment` says how the tree is held (recorded in the trial);
    `wall_s` is the job's wall time on the keeper's clock, from the fork to reaping it (None if never told)."""

    def __init__(self, argv: list[str], stdout=None, stderr=None, cwd: str | None = None,
                 env: dict[str, str] | None = None):
        import threading

        from gpuvs import spawn

        self.args = list(argv)
        self.pid: int | None = None
        self.returncode: int | None = None
        self.containment = "unknown"
        self.left = 0  # processes the job left running when it exited (ended by the keeper)
        self.wall_s: float | None = None  # the keeper's clock, from its fork of the job to reaping it
        self._failure: dict | None = None
        self._started, self._exited, self._done = threading.Event(), threading.Event(), threading.Event()
        ctl_r, self._ctl = os.pipe()  # the keeper's end reaches EOF when this process is gone
        st_r, st_w = os.pipe()
        cmd = [sys.executable, "-I", "-S", "-c", KEEPER, PACKAGE_ROOT, "--control", str(ctl_r), "--status", str(st_w),
               "--owner", str(os.getpid()), "--cgroup", cgroup_mode(), "--", *self.args]
        try:
            self.keeper = spawn.group_popen(cmd, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, cwd=cwd,
                                            env=env, pass_fds=(ctl_r, st_w))
        except BaseException:
            os.close(self._ctl)
            os.close(st_r)
            raise
        finally:
            os.close(ctl_r)
            os.close(st_w)
        self.stdout, self.stderr = self.keeper.stdout, self.keeper.stderr
        try:
            threading.Thread(target=self._read, args=(st_r,), name="gpuvs-keeper", daemon=True).start()
            if not self._started.wait(START_TIMEOUT_S):
                raise OSError(f"the keeper of {self.args[0]!r} did not start it within {START_TIMEOUT_S:g} s")
        except BaseException:  # interrupted while it starts: its keeper ends whatever started
            self._give_up()
            raise
        if self._failure is not None:
            self._end()
            f = self._failure
            raise OSError(f.get("errno") or 0, f.get("strerror") or "could not start", f.get("filename"))

    def _read(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as fh:
            for line in fh:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                op = msg.get("op")
                if op == "started":
                    self.pid, self.containment = int(msg["pid"]), str(msg.get("containment"))
                    self._started.set()
                elif op == "failed":
                    self._failure = msg
                    self._started.set()
                elif op == "exit":
                    self.returncode, self.wall_s = int(msg["code"]), msg.get("wall_s")
                    self._exited.set()
                elif op == "done":
                    self.left = int(msg.get("left") or 0)
                    self._done.set()
        self.keeper.wait()
        if not self._exited.is_set():  # the keeper itself was killed: the job's own group at least
            if self.pid:
                from gpuvs import spawn

                spawn.kill_group(self.pid)
            self.returncode = self.returncode if self.returncode is not None else -signal.SIGKILL
        for event in (self._started, self._exited, self._done):
            event.set()

    def poll(self) -> int | None:
        return self.returncode if self._exited.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode  # type: ignore[return-value]

    def _tell(self, text: str) -> None:
        try:
            os.write(self._ctl, text.encode())
        except OSError:
            pass

    def stop(self, grace_s: float) -> None:
        """SIGTERM to the job's whole tree, SIGKILL to what is left after grace_s; returns once it has ended."""
        if not self._done.is_set():
            self._tell(f"stop {grace_s:g}\n")
            if not self._done.wait(grace_s + END_TIMEOUT_S + 2):
                self._give_up()
        self._end()

    def close(self) -> None:
        """After the job's exit: until its keeper has ended what the job left running."""
        if not self._done.wait(END_TIMEOUT_S + 2):
            self._give_up()
        self._end()

    def _give_up(self) -> None:
        """The keeper does not answer: its group and the job's get SIGKILL from here."""
        from gpuvs import spawn

        self._end()  # a keeper still alive sees its control pipe close and ends the tree
        spawn.kill_group(self.keeper.pid)
        if self.pid:
            spawn.kill_group(self.pid)

    def _end(self) -> None:
        if self._ctl >= 0:
            os.close(self._ctl)
            self._ctl = -1
        try:
            self.keeper.wait(timeout=END_TIMEOUT_S + 2)
        except subprocess.TimeoutExpired:
            pass


def popen(argv: list[str], stdout=None, stderr=None, cwd: str | None = None,
          env: dict[str, str] | None = None) -> Contained:
    """Start argv under a keeper (stdin /dev/null, its own session); OSError as Popen raises it when it cannot start."""
    return Contained(argv, stdout=stdout, stderr=stderr, cwd=cwd, env=env)


# -- the keeper's side: cgroups ---------------------------------------------------------------------------------------

def _read(path: str) -> str:
    with open(path) as fh:
        return fh.read()


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def _start_time(pid: int) -> str | None:
    try:
        data = _read(f"/proc/{pid}/stat")
    except OSError:
        return None
    return data[data.rfind(")") + 2:].split()[19]


def _unescape(path: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def _own_folder(version: str) -> str:
    """The folder of this process's cgroup in the hierarchy of `version` (v2, or v1's freezer); OSError if none."""
    paths = {}
    for line in _read("/proc/self/cgroup").splitlines():
        ident, controllers, path = line.split(":", 2)
        if ident == "0" and not controllers:
            paths["v2"] = path
        elif "freezer" in controllers.split(","):
            paths["v1"] = path
    if version not in paths:
        raise OSError(f"no cgroup {version} hierarchy{' with a freezer' if version == 'v1' else ''} in /proc/self/cgroup")
    for line in _read("/proc/self/mountinfo").splitlines():
        left, _, right = line.partition(" - ")
        fields, fs = left.split(), right.split()
        if len(fields) < 5 or len(fs) < 3:
            continue
        root, point = _unescape(fields[3]), _unescape(fields[4])
        if (version == "v2" and fs[0] == "cgroup2") or (version == "v1" and fs[0] == "cgroup"
                                                          and "freezer" in fs[2].split(",")):
            rel = os.path.relpath(paths[version], root)
            if not rel.startswith(".."):
                return os.path.normpath(os.path.join(point, rel))
    raise OSError(f"the cgroup {version} hierarchy is not mounted here")


class Cgroup:
    """The job's cgroup: made under the keeper's own, named after the keeper (its pid and start time), so that a
    later keeper can tell one whose keeper is gone."""

    def __init__(self, version: str, path: str):
        self.version, self.path = version, path

    @classmethod
    def make(cls, version: str) -> "Cgroup":
        parent = _own_folder(version)
        me = os.getpid()
        cls.sweep(version, parent)
        group = cls(version, os.path.join(parent, f"{PREFIX}{me}-{_start_time(me)}"))
        os.mkdir(group.path)
        if not os.path.exists(os.path.join(group.path, "cgroup.procs")):
            group.remove()
            raise OSError(f"{group.path} has no cgroup.procs")
        return group

    @classmethod
    def sweep(cls, version: str, parent: str) -> None:
        """End what is left in the cgroups of keepers that are gone (killed outright), and remove them."""
        try:
            names = os.listdir(parent)
        except OSError:
            return
        for name in names:
            m = re.fullmatch(re.escape(PREFIX) + r"(\d+)-(\d+)", name)
            if m and _start_time(int(m.group(1))) != m.group(2):
                stale = cls(version, os.path.join(parent, name))
                stale.kill()
                stale.remove(wait_s=1.0)

    def procs(self) -> list[int]:
        try:
            return [int(p) for p in _read(os.path.join(self.path, "cgroup.procs")).split()]
        except OSError:
            return []

    def _freeze(self, on: bool) -> None:
        try:
            if self.version == "v2":
                _write(os.path.join(self.path, "cgroup.freeze"), "1" if on else "0")
                done = lambda: ("frozen 1" in _read(os.path.join(self.path, "cgroup.events"))) == on  # noqa: E731
            else:
                _write(os.path.join(self.path, "freezer.state"), "FROZEN" if on else "THAWED")
                done = lambda: (_read(os.path.join(self.path, "freezer.state")).strip() == "FROZEN") == on  # noqa: E731
            deadline = time.monotonic() + 1.0
            while not done() and time.monotonic() < deadline:
                time.sleep(0.005)
        except OSError:
            pass

    def kill(self) -> None:
        """SIGKILL to every process in it, frozen meanwhile (none can fork past the kill)."""
        if self.version == "v2" and os.path.exists(os.path.join(self.path, "cgroup.kill")):
            try:
                _write(os.path.join(self.path, "cgroup.kill"), "1")
                return
            except OSError:
                pass
        if not self.procs():
            return
        self._freeze(True)
        for pid in self.procs():
            _signal(pid, signal.SIGKILL)
        self._freeze(False)

    def remove(self, wait_s: float = 0.0) -> None:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.01)


# -- the keeper's side: the tree --------------------------------------------------------------------------------------

def _signal(pid: int, sig: int) -> None:
    if pid > 1 and pid != os.getpid():
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def descendants(root: int) -> list[int]:
    """Every live process below `root`, by the parent each names in /proc."""
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                data = _read(f"/proc/{name}/stat")
            except OSError:
                continue
            fields = data[data.rfind(")") + 2:].split()
            kids.setdefault(int(fields[1]), []).append(int(name))
    out, todo = [], [root]
    while todo:
        for child in kids.get(todo.pop(), ()):
            out.append(child)
            todo.append(child)
    return out


def _exit_code(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


class Keeper:
    def __init__(self, control: int, status: int, owner: int, mode: str):
        self.control, self.owner, self.me = control, owner, os.getpid()
        for fd in (control, status):  # the job must not hold them (its exec closes them)
            os.set_inheritable(fd, False)
        self.status = os.fdopen(status, "w", buffering=1)
        self.job: int | None = None
        self.code: int | None = None
        self.group: Cgroup | None = None
        self.stop_by: float | None = None  # a stop was asked for: SIGKILL to what is left then
        self.signalled = False
        self.started = 0.0
        self.containment = self._hold(mode)
        # before the job starts: a job that ends at once must still wake the loop below (SIGCHLD)
        self.wake_r, wake_w = os.pipe()
        for fd in (self.wake_r, wake_w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda s, f: None)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def tell(self, **message) -> None:
        try:
            self.status.write(json.dumps(message) + "\n")
        except OSError:
            pass

    def _hold(self, mode: str) -> str:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            reaper = f"no subreaper ({os.strerror(ctypes.get_errno())}): the job's process group only"
        else:
            reaper = "subreaper"
        if mode == "off":
            return f"{reaper} (no cgroup: {ENV}=off)"
        tried = []
        for version in (("v2", "v1") if mode not in ("v2", "v1") else (mode,)):
            try:
                self.group = Cgroup.make(version)
                return f"cgroup {version} {self.group.path} and {reaper}"
            except OSError as exc:
                tried.append(f"{version}: {exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else ""))
        note = "" if mode in MODES else f"{ENV}={mode} is not one of {', '.join(MODES)}; "
        return f"{reaper} (no cgroup: {note}{'; '.join(tried)})"

    def start(self, argv: list[str]) -> bool:
        """Fork the job, let it join the cgroup (a cgroup move takes 10-20 ms: before its clock starts), then let it
        exec: its wall time runs from here to reaping it. False (and the owner told) when it could not start."""
        go_r, go_w = os.pipe()
        note_r, note_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            self._child(argv, go_r, note_w)  # never returns
        self.job = pid
        os.close(go_r)
        os.close(note_w)
        with os.fdopen(note_r, "rb") as notes:
            joined = notes.readline().decode(errors="replace").strip() or "no answer from the job's process"
            if joined != "joined" and self.group:  # the job runs without its cgroup: the subreaper alone
                self.containment = (self.containment.split(" and ", 1)[-1]
                                    + f" (no cgroup: could not join {self.group.path}: {joined.partition(' ')[2]})")
                self.group.remove()
                self.group = None
            self.started = time.monotonic()
            os.write(go_w, b"g")
            os.close(go_w)
            failed = notes.readline().decode(errors="replace").split(" ", 2)  # nothing: it exec'd
        if len(failed) == 3 and failed[0] == "exec":
            os.waitpid(pid, 0)
            self.tell(op="failed", errno=int(failed[1]), strerror=failed[2].strip(), filename=argv[0])
            return False
        self.tell(op="started", pid=self.job, containment=self.containment)
        null = os.open(os.devnull, os.O_RDWR)  # the job's pipes are held by the job's tree alone
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
        return True

    def _child(self, argv: list[str], go: int, notes: int) -> None:
        """The job, before it execs: a session of its own, the cgroup joined, signals as a new process has them."""
        try:
            os.setsid()
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGCHLD, signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(sig, signal.SIG_DFL)  # SIGPIPE and SIGXFSZ: Python ignores them, as Popen restores
            note = "joined"
            if self.group:
                try:
                    _write(os.path.join(self.group.path, "cgroup.procs"), str(os.getpid()))
                except OSError as exc:
                    note = f"no {exc.strerror or exc}"
            os.write(notes, (note + "\n").encode())
            if not os.read(go, 1):  # the keeper is gone
                os._exit(127)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
            os.execvp(argv[0], argv)
        except OSError as exc:
            try:
                os.write(notes, f"exec {exc.errno or 0} {exc.strerror or exc}\n".encode())
            except OSError:
                pass
        finally:
            os._exit(127)

    def everyone(self) -> list[int]:
        pids = set(descendants(self.me))
        if self.group:
            pids.update(self.group.procs())
        pids.discard(self.me)
        return sorted(pids)

    def signal_all(self, sig: int) -> None:
        if sig == signal.SIGKILL and self.group:
            self.group.kill()
        for pid in self.everyone():
            _signal(pid, sig)

    def reap(self) -> bool:
        """Every child that has ended (the job's status kept and told); False once no child is left."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            if pid == self.job and self.code is None:
                self.code = _exit_code(status)
                self.tell(op="exit", code=self.code, wall_s=time.monotonic() - self.started)

    def stop(self, grace_s: float) -> None:
        if self.stop_by is None:
            self.stop_by = time.monotonic() + max(0.0, grace_s)
            self.signal_all(signal.SIGTERM)

    def _on_signal(self, signum, frame) -> None:
        self.signalled = True

    def run(self) -> None:
        wake_r = self.wake_r
        owner_gone = False
        while self.code is None:
            ready, _, _ = select.select([self.control, wake_r], [], [], 0.5)
            if wake_r in ready:
                try:
                    while os.read(wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
            self.reap()
            if self.code is not None:
                break
            if self.control in ready:
                data = os.read(self.control, 512)
                if not data:
                    owner_gone = True
                for word in data.decode(errors="replace").split("\n"):
                    if word.startswith("stop "):
                        self.stop(float(word.split()[1]))
            if owner_gone or os.getppid() != self.owner:
                owner_gone = True
                break
            if self.signalled:
                self.stop(3.0)
            if self.stop_by is not None and time.monotonic() > self.stop_by:
                self.signal_all(signal.SIGKILL)
        left = len(self.everyone())
        if self.stop_by is not None and not owner_gone:  # asked to stop: the rest gets its grace to end
            while time.monotonic() < self.stop_by and self.reap() and self.everyone():
                time.sleep(0.02)
        self.end()
        self.tell(op="done", left=left)

    def end(self) -> None:
        """SIGKILL to the whole tree until nothing of it is left; then its cgroup goes."""
        deadline = time.monotonic() + END_TIMEOUT_S
        while time.monotonic() < deadline:
            pids = self.everyone()
            children = self.reap()
            if not pids and not children:
                break
            self.signal_all(signal.SIGKILL)
            time.sleep(0.005)
        if self.group:
            self.group.remove(wait_s=1.0)


def keeper_main(argv: list[str]) -> int:
    opts: dict[str, str] = {}
    while argv and argv[0] != "--":
        opts[argv[0].lstrip("-")] = argv[1]
        argv = argv[2:]
    keeper = Keeper(int(opts["control"]), int(opts["status"]), int(opts["owner"]), opts.get("cgroup", "auto"))
    if keeper.start(argv[1:]):
        keeper.run()
    elif keeper.group:
        keeper.group.remove()
    return 0
