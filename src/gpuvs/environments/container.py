"""The container environment: the same worker, started by a real engine (podman or docker).

gpuvs's package is mounted read-only at /opt/gpuvs/gpuvs; the spec goes in as GPUVS_SPEC, never through a shell.
Every container is gpuvs-<run_id>, labelled gpuvs=1, removed on every exit path (docs/containers.md).
Never --privileged, no added capabilities, --network none unless --network is given."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gpuvs
from gpuvs import events
from gpuvs.probes import checkup
from gpuvs.environments import engine as engines
from gpuvs.environments import gpu_access, register
from gpuvs.environments.environment import Environment, Launched, check_local_gpus
from gpuvs.environments.host import ENV_VAR
from gpuvs.errors import GpuvsError, UsageError
from gpuvs.probes.fingerprint import SOFTWARE_FIELDS
from gpuvs.params import Param
from gpuvs.spec import RunSpec

PKG_INSIDE = "/opt/gpuvs"  # PYTHONPATH inside; the package is mounted at PKG_INSIDE/gpuvs
LABEL = "gpuvs"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_SIZE = re.compile(r"^\d+(\.\d+)?[bkmg]?$", re.I)
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MOUNT_OPTS = {"ro", "rw", "z", "Z", "O", "U", "rshared", "rslave", "rprivate", "shared", "slave", "private",
               "nosuid", "nodev", "noexec", "suid", "dev", "exec", "consistent", "cached", "delegated"}


# Options that mean the same for a container and a pod (both declare these Params).
IMAGE = Param("image", str, None, "image holding Python and the framework")
CPUS = Param("cpus", float, None, "CPU limit (CPUs)", min=0.01)
MEMORY = Param("memory", str, None, "memory limit, e.g. 4g")
SHM_SIZE = Param("shm_size", str, None, "/dev/shm size, e.g. 1g (engines default to 64m)")
MOUNT = Param("mount", str, None, "extra mount SRC:DST[:ro] (in a pod: a hostPath of the node)", multiple=True)
PYTHON = Param("python", str, None, "Python interpreter inside (default: python3; with --rootfs over this host, "
               "the one gpuvs runs under)")

PARAMS = (
    Param("engine", str, None, "container engine (default: podman if present, else docker)",
          choices=engines.ENGINES),
    IMAGE,
    Param("rootfs", str, None, "podman: a directory (or DIR:O for an overlay) used as the container's root"),
    Param("gpus", str, "auto", "GPU access in a container", choices=gpu_access.MODES),
    CPUS, MEMORY, SHM_SIZE,
    Param("ulimit", str, None, "container ulimit NAME=SOFT[:HARD], e.g. memlock=-1", multiple=True),
    MOUNT,
    ENV_VAR,
    Param("network", bool, False, "give the container a network (off by default)"),
    Param("engine_arg", str, None, "extra argument passed to the engine's global options", multiple=True),
    PYTHON,
)


def _as_list(value: Any) -> list[str]:
    if value in (None, "", False):
        return []
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [str(value)]


def _bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("1", "true", "yes", "on"):
        return True
    if str(value).lower() in ("0", "false", "no", "off", "", "none"):
        return False
    raise UsageError(f"--{name}: {value!r} is not allowed; expected true or false")


@dataclass
class Settings:
    """The container options of one run, checked."""

    engine: str | None = None
    image: str | None = None
    rootfs: str | None = None  # as given (DIR or DIR:O)
    gpus: str = "auto"
    cpus: float | None = None
    memory: str | None = None
    shm_size: str | None = None
    ulimits: dict[str, str] = field(default_factory=dict)  # name -> "SOFT[:HARD]"
    mounts: list[str] = field(default_factory=list)
    env_vars: dict[str, str] = field(default_factory=dict)
    network: bool = False
    engine_args: list[str] = field(default_factory=list)
    python: str | None = None

    @property
    def rootfs_dir(self) -> str | None:
        if not self.rootfs:
            return None
        path, sep, opts = self.rootfs.rpartition(":")
        return path if sep and opts and set(opts.split(",")) <= {"O", "idmap"} else self.rootfs

    def where(self) -> str:
        return f"image {self.image}" if self.image else f"rootfs {self.rootfs}"


def parse_options(options: dict[str, Any]) -> Settings:
    """Check every container option (from the command line or an experiment file) before anything starts."""
    s = Settings(engine=options.get("engine") or None, image=options.get("image") or None,
                 rootfs=options.get("rootfs") or None, python=options.get("python") or None)
    if s.image and s.rootfs:
        raise UsageError("give --image or --rootfs, not both")
    if not s.image and not s.rootfs:
        raise UsageError("--env container needs --image IMAGE (with Python and the framework) "
                         "or --rootfs DIR[:O] (podman; /:O is an overlay of this host's root)")
    if s.rootfs and not os.path.isdir(s.rootfs_dir or ""):
        raise UsageError(f"--rootfs {s.rootfs}: {s.rootfs_dir} is not a folder")
    s.gpus = str(options.get("gpus") or "auto")
    if s.gpus not in gpu_access.MODES:
        raise UsageError(f"--gpus: {s.gpus!r} is not allowed; expected one of {', '.join(gpu_access.MODES)}")
    if options.get("cpus") not in (None, ""):
        try:
            s.cpus = float(options["cpus"])
        except (TypeError, ValueError):
            raise UsageError(f"--cpus: {options['cpus']!r} is not a number") from None
        if s.cpus <= 0:
            raise UsageError(f"--cpus must be positive, got {options['cpus']}")
        if s.cpus > (os.cpu_count() or 1):
            raise UsageError(f"--cpus {options['cpus']:g} is more than the {os.cpu_count()} CPUs of this host")
    for key in ("memory", "shm_size"):
        value = options.get(key)
        if value not in (None, ""):
            if not _SIZE.match(str(value)):
                raise UsageError(f"--{key.replace('_', '-')}: {value!r} is not a size; expected e.g. 256m, 4g")
            setattr(s, key, str(value))
    for item in _as_list(options.get("ulimit")):
        s.ulimits.update([_ulimit(item)])
    for item in _as_list(options.get("mount")):
        s.mounts.append(_mount(item))
    for item in _as_list(options.get("env_var")):
        key, sep, value = item.partition("=")
        if not sep or not _ENV_KEY.match(key):
            raise UsageError(f"--env-var: expected KEY=VALUE, got {item!r}")
        if key == "GPUVS_SPEC":
            raise UsageError("--env-var GPUVS_SPEC: gpuvs sets the run spec itself")
        s.env_vars[key] = value
    s.network = _bool("network", options.get("network", False))
    s.engine_args = _as_list(options.get("engine_arg"))
    return s


def _ulimit(item: str) -> tuple[str, str]:
    name, sep, value = item.partition("=")
    name = name.strip()
    if not sep or name not in engines.RLIMITS:
        raise UsageError(f"--ulimit: expected NAME=SOFT[:HARD] with NAME one of {', '.join(engines.RLIMITS)}, "
                         f"got {item!r}")
    parts = value.split(":")
    if len(parts) > 2 or not all(re.fullmatch(r"-1|\d+|unlimited", p) for p in parts):
        raise UsageError(f"--ulimit {item}: limits are integers, -1 or unlimited (SOFT or SOFT:HARD)")
    nums = [-1 if p in ("-1", "unlimited") else int(p) for p in parts]
    if len(nums) == 2 and nums[1] != -1 and (nums[0] == -1 or nums[0] > nums[1]):
        raise UsageError(f"--ulimit {item}: the soft limit is above the hard limit")
    value = ":".join("-1" if n == -1 else str(n) for n in nums)
    _refuse_above_hard_limit(name, value, "CapBnd")  # no process here, whatever the engine, could raise it
    return name, value


def _refuse_above_hard_limit(name: str, value: str, capabilities: str) -> None:
    """UsageError if the ulimit asks for more than this process's hard limit and the named capability set
    (CapBnd: anything on this host; CapEff: an engine that runs as this process) lacks CAP_SYS_RESOURCE."""
    hard = engines.current_hard_limit(name)
    asked = int(value.split(":")[-1])
    if hard is not None and (asked == -1 or asked > hard) and \
            not engines.has_capability(engines.CAP_SYS_RESOURCE, capabilities):
        raise UsageError(f"--ulimit {name}={value}: above this process's hard limit ({hard}), and without "
                         f"CAP_SYS_RESOURCE the engine cannot raise it; use at most {name}={hard}:{hard}")


def _mount(item: str) -> str:
    parts = item.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
        raise UsageError(f"--mount: expected SRC:DST[:ro], got {item!r}")
    src, dst = parts[0], parts[1]
    if not os.path.isabs(src) or not os.path.exists(src):
        raise UsageError(f"--mount {item}: {src} is not an existing absolute path on this host")
    if not os.path.isabs(dst):
        raise UsageError(f"--mount {item}: {dst} must be an absolute path inside the container")
    if len(parts) == 3 and not set(parts[2].split(",")) <= _MOUNT_OPTS:
        raise UsageError(f"--mount {item}: unknown mount option(s) {parts[2]!r} (use ro or rw)")
    return item


class ContainerLaunched(Launched):
    """A containerised worker. When the engine fails before the worker speaks (no python in the image,
    a ulimit the engine cannot set, the memory limit's OOM kill), one error event says so plainly."""

    def __init__(self, argv: list[str], env: dict[str, str], on_kill, explain):
        self._explain = explain
        self._saw_error = False
        super().__init__(argv, env=env, on_kill=on_kill)

    def observe(self, line: str) -> None:
        if '"error"' in line:
            event = events.decode(line)
            self._saw_error = self._saw_error or bool(event and event["type"] == "error")

    def after_exit(self, code: int) -> list[str]:
        lines = super().after_exit(code)
        if code != 0 and not self._saw_error:
            self._threads[1].join(timeout=5)  # the engine's whole message
            found = self._explain(code, list(self.stderr_tail))
            if found:
                lines.append(events.encode(events.error(*found)) + "\n")
        return lines


@register
class ContainerEnvironment(Environment):
    kind = "container"
    summary = "a podman or docker container on this machine"
    noun = "a container"
    rank = 10
    params = PARAMS
    internal_keys = ("mps",)  # gpuvs share: its MPS daemon's pipe folder, mounted in
    fingerprint_fields = (("in_container", "in a container"), ("container_image", "image"))
    runs_bare = True
    explains = {"env": SOFTWARE_FIELDS, "image": SOFTWARE_FIELDS, "rootfs": SOFTWARE_FIELDS,
                "engine": SOFTWARE_FIELDS, "gpus": ("gpu_count", "gpu_name")}
    # --fresh fork: one container per arm, kept for the experiment, holds the zygote; each trial is a fresh
    # process in it (sharing the container's filesystem, /dev/shm and cgroup). Asked for, never the default:
    # a fresh container per trial is what a container comparison usually asks about.
    forks = True

    @classmethod
    def label(cls, options: dict[str, Any]) -> str:
        where = options.get("image") or options.get("rootfs") or ""
        return ":".join(p for p in (cls.kind, options.get("engine") or "", where) if p)

    def __init__(self, options: dict | None = None):
        super().__init__(options)

    # -- what to run -------------------------------------------------------------------------

    @classmethod
    def parse_settings(cls, options: dict[str, Any]) -> Settings:
        return parse_options(options)

    def engine(self) -> engines.Engine:
        return engines.detect(self.settings.engine, self.settings.engine_args)

    def describe(self) -> str:
        s = self.settings
        return f"container ({s.engine or 'auto'}, {s.where()})"

    def check(self, spec: RunSpec) -> None:
        s = self.settings
        eng = self.engine()
        if s.rootfs and eng.name != "podman":
            raise UsageError("--rootfs is a podman option; with docker give --image")
        if eng.name == "podman":  # podman's runtime runs with this process's own capabilities
            for name, value in s.ulimits.items():
                _refuse_above_hard_limit(name, value, "CapEff")
        if s.image:
            engines.image_env(eng, s.image)
        check_local_gpus(spec)
        self.gpu_plan(spec, eng)

    def gpu_plan(self, spec: RunSpec, eng: engines.Engine | None = None) -> gpu_access.GpuPlan:
        eng = eng or self.engine()
        return gpu_access.plan(self.settings.gpus, eng.name, spec.device, eng.info.get("runtimes"))

    def python(self) -> str:
        s = self.settings
        if s.python:
            return s.python
        if s.rootfs_dir and os.path.exists(os.path.join(s.rootfs_dir, sys.executable.lstrip("/"))):
            return sys.executable  # an overlay of this host: the interpreter gpuvs runs under is there
        return "python3"

    def here_inside(self) -> str | None:
        """gpuvs's working directory as the container sees it, where it sees it: through a --mount of it or of a
        folder above it (DST and the rest of the path), or at the same path in a --rootfs folder with no mount point
        between them (an overlay of a folder holds that filesystem only). None where the container cannot see it
        (an image without such a mount)."""
        s = self.settings
        cwd = os.getcwd()
        for m in s.mounts:
            src, dst = (os.path.realpath(p) if i == 0 else p for i, p in enumerate(m.split(":")[:2]))
            if cwd == src or cwd.startswith(src.rstrip("/") + "/"):
                return (dst.rstrip("/") + cwd[len(src.rstrip("/")):]) or "/"
        top = s.rootfs_dir
        if top:
            top = os.path.realpath(top)
            here = os.path.join(top, cwd.lstrip("/")).rstrip("/") or "/"
            if os.path.isdir(here) and os.path.realpath(here) == here:
                path = here
                while path != top and path != "/":
                    if os.path.ismount(path):
                        return None
                    path = os.path.dirname(path)
                return cwd
        return None

    def workdir_note(self, workdir: str | None) -> str | None:
        """Where a command without --workdir cannot start in the folder a host arm starts in: a warning saying so
        and how to fix it."""
        if workdir or self.here_inside() is not None:
            return None
        cwd = os.getcwd()
        return (f"warning: the container ({self.settings.where()}) cannot see this folder ({cwd}): the command starts "
                f"in the image's working directory, while on the host it starts here, so relative paths differ; "
                f"give --workdir DIR (workdir= in an arm), with --mount {cwd}:DIR to bring this folder in")

    def container_name(self, spec: RunSpec) -> str:
        return f"gpuvs-{spec.run_id}"

    def command(self, spec: RunSpec, entry: tuple[str, ...] = ("-m", "gpuvs.trial.inside"),
                folders: tuple[str, ...] = (), bare: list[str] | None = None,
                workdir: str | None = None) -> tuple[list[str], dict]:
        """(argv, environment of the engine process) for one run; start() adds the spec to that environment.
        `bare`: the command itself as the container's process (bare mode): no gpuvs package, no run spec, no
        --rm (the engine's record of its start and exit is read after it ends, then it is removed)."""
        s = self.settings
        eng = self.engine()
        gpu = self.gpu_plan(spec, eng)
        image_env = engines.image_env(eng, s.image) if s.image else {}
        args = ["run", *(["--rm"] if bare is None else []), "--name", self.container_name(spec), "--label", f"{LABEL}=1",
                "--label", f"{LABEL}.run_id={spec.run_id}", "--label", f"{LABEL}.arm={spec.arm}"]
        if spec.experiment_id:
            args += ["--label", f"{LABEL}.experiment={spec.experiment_id}"]
        if not s.network:
            args += ["--network", "none"]
        if s.cpus is not None:
            args += ["--cpus", f"{s.cpus:g}"]
        if s.memory:
            args += ["--memory", s.memory]
        if s.shm_size:
            args += ["--shm-size", s.shm_size]
        ulimits = dict(s.ulimits)
        detected = eng.run_args
        for i in range(0, len(detected) - 1, 2):
            if detected[i] == "--ulimit":
                name, _, value = detected[i + 1].partition("=")
                ulimits.setdefault(name, value)
        for name, value in ulimits.items():
            args += ["--ulimit", f"{name}={value}"]
        if bare is None:
            args += ["-v", f"{Path(gpuvs.__file__).resolve().parent}:{PKG_INSIDE}/gpuvs:ro"]
        workdir = workdir or self.here_inside()  # where a host arm starts, where the container can see it
        if workdir:
            args += ["-w", workdir]
        for m in s.mounts:
            args += ["-v", m]
        if spec.barrier:  # gpuvs share: the start barrier is a folder every worker sees at the same path
            args += ["-v", f"{spec.barrier['dir']}:{spec.barrier['dir']}"]
        for folder in folders:  # a zygote's control socket (launch.py), at the same path inside
            args += ["-v", f"{folder}:{folder}"]
        mps_root = self.options.get("mps")  # internal: gpuvs share's MPS pipe folder, not a user option
        if mps_root:  # gpuvs's own MPS daemon: its pipe and log folders, and the host's IPC namespace it needs
            root = str(Path(mps_root).parent)
            args += ["-v", f"{root}:{root}", "--ipc", "host"]
        args += gpu.args
        inside: dict[str, str] = {"PYTHONUNBUFFERED": "1", "GPUVS_CONTAINER_IMAGE": s.image or f"rootfs:{s.rootfs}",
                                  "GPUVS_NODE_NAME": socket.gethostname()}
        user_pp = s.env_vars.get("PYTHONPATH") or image_env.get("PYTHONPATH")
        if bare is None:
            inside["PYTHONPATH"] = PKG_INSIDE + (f":{user_pp}" if user_pp else "")
        else:
            inside = {"PYTHONUNBUFFERED": "1"}
        if gpu.ld_library_path:
            base = s.env_vars.get("LD_LIBRARY_PATH") or image_env.get("LD_LIBRARY_PATH")
            inside["LD_LIBRARY_PATH"] = ":".join(gpu.ld_library_path + ([base] if base else []))
        if gpu.path:
            inside["PATH"] = ":".join(gpu.path + [s.env_vars.get("PATH") or image_env.get("PATH") or DEFAULT_PATH])
        if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
            inside["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
        for key, value in s.env_vars.items():
            inside.setdefault(key, value)
        for key, value in inside.items():
            args += ["-e", f"{key}={value}"]
        if bare is None:
            args += ["-e", "GPUVS_SPEC"]  # the value comes from the engine's environment, not from argv
        args += ["--rootfs", s.rootfs] if s.rootfs else [s.image]
        args += [self.python(), *entry] if bare is None else list(bare)
        return eng.argv(*args), dict(os.environ)

    # -- running it --------------------------------------------------------------------------

    def launch(self, spec: RunSpec) -> Launched:
        return self.start(spec)

    def start_zygote(self, spec: RunSpec, args: list[str], folder: str) -> ContainerLaunched:
        return self.start(spec, entry=("-m", "gpuvs.trial.zygote", *args, "--entry", "inside"), folders=(folder,))

    def start(self, spec: RunSpec, entry: tuple[str, ...] = ("-m", "gpuvs.trial.inside"),
              folders: tuple[str, ...] = ()) -> ContainerLaunched:
        argv, env = self.command(spec, entry, folders)
        spec.launched_at = time.time()  # after gpuvs's own preparation: the clock counts the engine's work
        env["GPUVS_SPEC"] = spec.to_json()
        name = self.container_name(spec)
        return ContainerLaunched(argv, env, on_kill=lambda: self.remove(name),
                                 explain=lambda code, tail: self.explain(code, tail))

    def start_bare(self, spec: RunSpec, argv: list[str], workdir: str | None):
        """Bare mode: the command is the container's own process (no Python needed in the image); its output is
        what the engine's client relays, its times the engine's record of the container's start and exit."""
        from gpuvs.environments.container_job import ContainerJob

        command, env = self.command(spec, bare=argv, workdir=workdir)
        spec.launched_at = time.time()
        return ContainerJob(self, spec, command, env)

    def remove(self, name: str) -> None:
        """Remove a container whatever its state; quiet when it is already gone."""
        eng = self.engine()
        args = ["rm", "-f", "-i", "-t", "0", name] if eng.name == "podman" else ["rm", "-f", name]
        try:
            eng.call(*args, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            pass

    def explain(self, code: int, tail: list[str]) -> tuple[str, str] | None:
        """A plain (kind, message) for an engine failure the worker could not report itself."""
        s = self.settings
        text = "\n".join(tail)
        errline = engines.first_error(text) if text.strip() else f"exit status {code}"
        low = text.lower()
        python = self.python()
        if code == 127 or "executable file not found" in low or (
                "no such file or directory" in low and python in text):
            return ("unavailable", f"the container ({s.where()}) has no {python}: gpuvs needs Python 3.10+ inside, "
                                   "with the workload's framework; use an image that has them, or give --python PATH")
        if "error setting rlimit" in low:
            return ("unavailable", f"the engine could not set a ulimit in the container ({errline}); give "
                                   "--ulimit nofile=N:N / nproc=N:N at or below this shell's limits (ulimit -Hn, "
                                   "ulimit -Hu) or see docs/containers.md")
        if code == 137 and s.memory:
            return ("oom", f"the worker was killed (SIGKILL, exit status 137) in a container limited to "
                           f"--memory {s.memory}: most likely it ran out of memory")
        if code in (125, 126):
            return ("unavailable", f"{self.engine().name} could not start the container: {errline}")
        return None

    # -- gpuvs doctor ------------------------------------------------------------------------

    def doctor(self, spec: RunSpec, report, timeout: float) -> dict[str, Any] | None:
        """The engine, its settings and quirks, the image, GPU access, then one real container that
        reports what it sees inside."""
        try:
            s = self.settings
            eng = self.engine()
        except GpuvsError as exc:
            report.add("engine", "FAIL", str(exc))
            return None
        report.add("engine", "ok", f"{eng.name} {eng.version} at {eng.path}")
        report.add("engine settings", "ok", " ".join(eng.global_args) or "(none)")
        for note in eng.notes:
            report.add("detected", "ok", note)
        try:
            self.check(spec)
            report.add("image" if s.image else "rootfs", "ok", s.image or s.rootfs or "")
        except GpuvsError as exc:
            report.add("image / GPU access", "FAIL", str(exc))
            return None
        plan = self.gpu_plan(spec, eng)
        report.add("GPU access", "ok", plan.mode + ("" if not plan.notes else ": " + "; ".join(plan.notes)))
        t0 = time.monotonic()
        launched = self.start(spec, entry=("-m", "gpuvs.trial.inside", "--probe"))
        run = checkup.read_probe(launched, timeout)
        if run.timed_out:
            report.add("start a container", "FAIL", f"no answer within {timeout:g} s")
            return None
        probe = run.probe
        if probe is None:
            found = self.explain(run.code, list(launched.stderr_tail))
            detail = found[1] if found else f"exit status {run.code}: " + " | ".join(list(launched.stderr_tail)[-4:])
            report.add("start a container", "FAIL", detail)
            return None
        report.add("start a container", "ok",
                   f"{time.monotonic() - t0:.2f} s, {self.python()} = Python {probe['python']}")
        return probe
