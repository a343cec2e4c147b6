"""Container engines (podman, docker): finding one, asking whether it works, and the host quirks it needs.

The quirks are detected here rather than hard-coded, and apply only where the user's own arguments leave them unset.
The user's arguments are GPUVS_PODMAN_ARGS / GPUVS_DOCKER_ARGS, then --engine-arg.
What is detected, and what it adds: docs/containers.md."""

from __future__ import annotations

import json
import os
import resource
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

from gpuvs.errors import EnvironmentUnavailable, UsageError

ENGINES = ("podman", "docker")
CAP_SYS_RESOURCE = 24
# ulimit names the engines accept, and the rlimit each one sets
RLIMITS = {"core": "RLIMIT_CORE", "cpu": "RLIMIT_CPU", "data": "RLIMIT_DATA", "fsize": "RLIMIT_FSIZE",
           "locks": "RLIMIT_LOCKS", "memlock": "RLIMIT_MEMLOCK", "msgqueue": "RLIMIT_MSGQUEUE",
           "nice": "RLIMIT_NICE", "nofile": "RLIMIT_NOFILE", "nproc": "RLIMIT_NPROC", "rss": "RLIMIT_RSS",
           "rtprio": "RLIMIT_RTPRIO", "rttime": "RLIMIT_RTTIME", "sigpending": "RLIMIT_SIGPENDING",
           "stack": "RLIMIT_STACK", "as": "RLIMIT_AS"}
FORBIDDEN_ARGS = ("--privileged", "--cap-add")


@dataclass
class Engine:
    """A working engine: how to call it, and what gpuvs detected about this host."""

    name: str
    path: str
    version: str = ""
    global_args: list[str] = field(default_factory=list)
    run_args: list[str] = field(default_factory=list)  # detected defaults for `run` (ulimits)
    notes: list[str] = field(default_factory=list)  # what was detected, and why (gpuvs doctor shows it)
    info: dict[str, Any] = field(default_factory=dict)

    def argv(self, *args: str) -> list[str]:
        return [self.path, *self.global_args, *args]

    def call(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(*args), capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    @property
    def rootless(self) -> bool:
        return bool(((self.info.get("host") or {}).get("security") or {}).get("rootless")) or os.geteuid() != 0


_CACHE: dict[tuple, Engine] = {}


def user_args(name: str, extra: list[str] | None = None) -> list[str]:
    raw = os.environ.get(f"GPUVS_{name.upper()}_ARGS", "")
    try:
        args = shlex.split(raw) + list(extra or [])
    except ValueError as exc:
        raise UsageError(f"GPUVS_{name.upper()}_ARGS cannot be split into arguments: {exc}") from None
    for arg in args:
        if arg.split("=", 1)[0] in FORBIDDEN_ARGS:
            raise UsageError(f"{arg}: gpuvs never runs containers privileged or with added capabilities")
    return args


def pick(name: str | None) -> tuple[str, str]:
    """(engine name, path); the named one, else podman if present, else docker."""
    if name:
        if name not in ENGINES:
            raise UsageError(f"unknown container engine {name!r}: use podman or docker")
        path = shutil.which(name)
        if not path:
            hint = "apt-get install podman runc" if name == "podman" else "install docker, or use --engine podman"
            raise EnvironmentUnavailable(f"container engine {name} not found on PATH ({hint})")
        return name, path
    for candidate in ENGINES:
        path = shutil.which(candidate)
        if path:
            return candidate, path
    raise EnvironmentUnavailable("no container engine found on PATH: install podman (apt-get install podman runc) "
                                 "or docker, or name one with --engine")


def detect(name: str | None = None, engine_args: list[str] | None = None) -> Engine:
    """A working engine with its detected settings; EnvironmentUnavailable with one clear line if there is
    none. Cached per process (asking the engine costs a fraction of a second)."""
    name, path = pick(name)
    args = user_args(name, engine_args)
    key = (name, path, tuple(args))
    if key not in _CACHE:
        engine = Engine(name=name, path=path, global_args=list(args))
        (_probe_podman if name == "podman" else _probe_docker)(engine)
        _CACHE[key] = engine
    return _CACHE[key]


def first_error(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        if ln.lower().startswith(("error", "cannot connect")):
            return ln
    return lines[-1] if lines else "no output"


def _run(engine: Engine, *args: str) -> subprocess.CompletedProcess:
    try:
        return engine.call(*args, timeout=60)
    except subprocess.TimeoutExpired:
        raise EnvironmentUnavailable(f"{engine.name} did not answer `{' '.join(args)}` within 60 s") from None
    except OSError as exc:
        raise EnvironmentUnavailable(f"cannot run {engine.path}: {exc}") from None


def _probe_docker(engine: Engine) -> None:
    r = _run(engine, "version", "--format", "{{json .Server}}")
    if r.returncode != 0 or r.stdout.strip() in ("", "null"):
        err = first_error(r.stderr or r.stdout)
        if "cannot connect" in err.lower() or "is the docker daemon running" in err.lower():
            raise EnvironmentUnavailable(f"docker is installed but its daemon is not running ({err}): start it, "
                                         "or use --engine podman")
        raise EnvironmentUnavailable(f"docker does not work here: {err}")
    server = json.loads(r.stdout)
    engine.version = server.get("Version", "")
    engine.info = {"server": server}
    r = _run(engine, "info", "--format", "{{json .Runtimes}}")
    try:
        engine.info["runtimes"] = sorted(json.loads(r.stdout or "{}"))
    except ValueError:
        engine.info["runtimes"] = []
    if local_docker_daemon(engine.global_args) and not has_capability(CAP_SYS_RESOURCE, "CapBnd"):
        _add_rlimit_args(engine)


def local_docker_daemon(global_args: list[str]) -> bool:
    """Whether docker talks to a daemon on this host: a unix socket (the default), no other context. (A
    socket bind-mounted from elsewhere looks local; the ulimits added then are this process's own, which
    any daemon can set.)"""
    hosts = [a.split("=", 1)[1] for a in global_args if a.startswith(("--host=", "-H="))]
    hosts += [b for a, b in zip(global_args, global_args[1:]) if a in ("-H", "--host")]
    if any(a.split("=", 1)[0] == "--context" for a in global_args):
        return False
    if os.environ.get("DOCKER_CONTEXT", "default") != "default":
        return False
    return all(h.startswith("unix://") for h in hosts + [os.environ.get("DOCKER_HOST") or "unix://"])


def _add_rlimit_args(engine: Engine) -> None:
    engine.run_args += rlimit_args()
    engine.notes.append(f"{' '.join(engine.run_args)}: without CAP_SYS_RESOURCE the engine cannot raise "
                        "rlimits above the hard limits it runs with")


def _probe_podman(engine: Engine) -> None:
    r = _run(engine, "info", "--format", "json")
    if r.returncode != 0:
        err = first_error(r.stderr or r.stdout)
        if "connect" in err.lower():
            raise EnvironmentUnavailable(f"podman is not running or not reachable ({err})")
        raise EnvironmentUnavailable(f"podman does not work here: {err}")
    try:
        engine.info = json.loads(r.stdout)
    except ValueError:
        raise EnvironmentUnavailable(f"podman info gave no JSON: {r.stdout[:200]!r}") from None
    engine.version = (engine.info.get("version") or {}).get("Version", "")
    host = engine.info.get("host") or {}
    given = set(a.split("=", 1)[0] for a in engine.global_args)
    if "--cgroup-manager" not in given and host.get("cgroupManager") == "systemd" and not systemd_running():
        engine.global_args += ["--cgroup-manager", "cgroupfs"]
        engine.notes.append("--cgroup-manager cgroupfs: systemd is not running here")
    runtime = (host.get("ociRuntime") or {}).get("name", "")
    if "--runtime" not in given and runtime == "crun" and cgroup_layout() == "hybrid" and shutil.which("runc"):
        engine.global_args += ["--runtime", "runc"]
        engine.notes.append("--runtime runc: crun refuses this host's hybrid cgroup v1+v2 layout")
    if not engine.rootless and not has_capability(CAP_SYS_RESOURCE):
        _add_rlimit_args(engine)


# -- host facts ----------------------------------------------------------------------------------

def systemd_running() -> bool:
    return os.path.isdir("/run/systemd/system")


def cgroup_layout(mounts_file: str = "/proc/self/mounts") -> str:
    """v2 (unified), hybrid (v1 controllers + a v2 hierarchy), v1, or none."""
    v1 = v2_root = v2_other = False
    try:
        with open(mounts_file) as fh:
            for line in fh:
                parts = line.split()
                if len(parts) < 3:
                    continue
                where, kind = parts[1], parts[2]
                if kind == "cgroup2":
                    if where == "/sys/fs/cgroup":
                        v2_root = True
                    else:
                        v2_other = True
                elif kind == "cgroup":
                    v1 = True
    except OSError:
        return "none"
    if v2_root:
        return "v2"
    if v1:
        return "hybrid" if v2_other else "v1"
    return "none"


def has_capability(bit: int, which: str = "CapEff", status_file: str = "/proc/self/status") -> bool:
    """Whether this process's effective set (or, with which="CapBnd", its bounding set: what any process
    here could ever hold) has the capability."""
    try:
        with open(status_file) as fh:
            for line in fh:
                if line.startswith(which + ":"):
                    return bool(int(line.split()[1], 16) >> bit & 1)
    except (OSError, ValueError):
        pass
    return True  # cannot tell: assume the usual root


def pid_max() -> int | None:
    try:
        with open("/proc/sys/kernel/pid_max") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def rlimit_args() -> list[str]:
    """Explicit nofile and nproc ulimits that an engine without CAP_SYS_RESOURCE can set."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    out = [f"nofile={_lim(soft)}:{_lim(hard)}"]
    psoft, phard = resource.getrlimit(resource.RLIMIT_NPROC)
    cap = pid_max()
    n = min(x for x in (psoft, phard, cap) if x is not None and x != resource.RLIM_INFINITY) \
        if any(x is not None and x != resource.RLIM_INFINITY for x in (psoft, phard, cap)) else -1
    out.append(f"nproc={n}:{n}")
    return [a for u in out for a in ("--ulimit", u)]


def _lim(v: int) -> str:
    return "-1" if v == resource.RLIM_INFINITY else str(v)


def current_hard_limit(name: str) -> int | None:
    """This process's hard limit for a ulimit name; None when unlimited or unknown."""
    attr = RLIMITS.get(name)
    if not attr or not hasattr(resource, attr):
        return None
    hard = resource.getrlimit(getattr(resource, attr))[1]
    return None if hard == resource.RLIM_INFINITY else hard


def image_env(engine: Engine, image: str) -> dict[str, str]:
    """The image's own environment (PATH, LD_LIBRARY_PATH...); EnvironmentUnavailable if the image is not
    present locally (gpuvs never pulls: a pull inside a timed trial would be measured as start-up)."""
    key = (engine.path, tuple(engine.global_args), "image", image)
    cached = _IMAGES.get(key)
    if cached is not None:
        return cached
    r = _run(engine, "image", "inspect", "--format", "{{json .Config.Env}}", image)
    if r.returncode != 0:
        raise EnvironmentUnavailable(f"image {image} is not present in {engine.name}'s local storage "
                                     f"({first_error(r.stderr or r.stdout)}); pull it first: "
                                     f"{engine.name} pull {image}")
    env: dict[str, str] = {}
    try:
        for item in json.loads(r.stdout or "null") or []:
            k, _, v = item.partition("=")
            env[k] = v
    except ValueError:
        pass
    _IMAGES[key] = env
    return env


_IMAGES: dict[tuple, dict[str, str]] = {}
