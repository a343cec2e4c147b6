"""What a command job actually ran, read where it ran: recorded per trial as the configuration item `program`.

So a comparison can tell two arms that ran "the same command" with two different programs (analysis/programs.py).
The executable with its sha256, its version where it safely says one, an interpreter's script, the working directory.
Standard library only (with gpuvs.contain and gpuvs.safetext): it runs inside the user's image."""

from __future__ import annotations

import hashlib
import os
import re
import select
import subprocess
import time
from typing import Any

from gpuvs.safetext import safe_text

VERSION_TIMEOUT_S = 3.0  # `EXE --version` gets this long (then it and what it started are ended)
VERSION_BYTES = 4096  # of its output read, at most
INTERPRETERS = re.compile(r"^(python|pypy|bash|sh|dash|zsh|ksh|fish|node|nodejs|deno|bun|perl|ruby|php|rscript|"
                          r"julia|lua|luajit|tclsh|wish)[0-9.]*$", re.I)
# programs that print their version for --version and do nothing else (the parsers' own tools among them)
KNOWN_TOOLS = re.compile(r"^(java|gcc|g\+\+|clang|clang\+\+|nvcc|nvidia-smi|sysbench|stress-ng|hyperfine|fio|iperf3|"
                         r"ffmpeg|make|cmake|go|rustc|cargo|dotnet|torchrun|accelerate|deepspeed|mpirun|"
                         r"all_reduce_perf|all_gather_perf|git|curl|wget|tar|gzip|xz|zstd|openssl)$", re.I)


def says_version(exe: str) -> bool:
    """Whether `EXE --version` is known to print a version and do nothing else."""
    name = os.path.basename(exe)
    return bool(INTERPRETERS.match(name) or KNOWN_TOOLS.match(name))


class Root:
    """The files a job saw, read from here: "/" with no mounts where the reader runs beside the job (its wrapper,
    or gpuvs beside a bare job on the host); a stopped container's root folder and its bind mounts (DST inside,
    SRC here) for a bare container, read from outside. Links are followed inside it, never out of it."""

    def __init__(self, top: str = "/", mounts: list[tuple[str, str]] | None = None):
        self.top = top.rstrip("/")
        self.mounts = sorted(mounts or [], key=lambda m: -len(m[0]))

    def here(self, inside: str) -> str:
        """Where an absolute path inside (links already followed) is read from here."""
        for dst, src in self.mounts:
            dst = dst.rstrip("/") or "/"
            if inside == dst or inside.startswith(dst.rstrip("/") + "/"):
                return src.rstrip("/") + inside[len(dst.rstrip("/")):]
        return self.top + inside

    def follow(self, inside: str) -> str | None:
        """An absolute path inside with its links followed inside (None: a loop of links)."""
        parts = [p for p in inside.split("/") if p]
        cur, hops = "/", 0
        while parts:
            part = parts.pop(0)
            if part == ".":
                continue
            if part == "..":
                cur = os.path.dirname(cur)
                continue
            nxt = os.path.join(cur, part)
            here = self.here(nxt)
            if os.path.islink(here):
                hops += 1
                if hops > 40:
                    return None
                target = os.readlink(here)
                parts = [p for p in target.split("/") if p] + parts
                if target.startswith("/"):
                    cur = "/"
                continue
            cur = nxt
        return cur

    def executable(self, inside: str) -> bool:
        real = self.follow(inside)
        here = self.here(real) if real else None
        return bool(here) and os.path.isfile(here) and os.access(here, os.X_OK)

    def is_file(self, inside: str) -> bool:
        real = self.follow(inside)
        return bool(real) and os.path.isfile(self.here(real))


BESIDE = Root()  # the job's own files, read where it runs


def resolve(name: str, cwd: str, path: str | None, root: Root = BESIDE) -> str | None:
    """argv[0] as exec would run it, with `cwd` the job's working directory and `path` its PATH (None: the
    default search path): the file's absolute path inside, or None where there is no such executable."""
    if os.sep in name:
        full = os.path.normpath(os.path.join(cwd, name))
        return full if root.executable(full) else None
    for folder in (path if path is not None else os.defpath).split(os.pathsep):
        full = os.path.normpath(os.path.join(cwd, folder or ".", name))
        if root.executable(full):
            return full
    return None


def file_facts(path: str, root: Root = BESIDE) -> dict[str, Any]:
    """{"path", "real" (where a link leads, if elsewhere), "size", "sha256"} of a file (paths inside); what could
    not be read is left out ("unread" says why)."""
    out: dict[str, Any] = {"path": path}
    real = root.follow(path) or path
    if real != path:
        out["real"] = real
    try:
        digest = hashlib.sha256()
        size = 0
        with open(root.here(real), "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
                size += len(chunk)
        out.update(size=size, sha256=digest.hexdigest())
    except OSError as exc:
        out["unread"] = exc.strerror or str(exc)
    return out


def script_of(argv: list[str], cwd: str, root: Root = BESIDE) -> str | None:
    """For an interpreter: its first argument that is an existing file (the script it ran); None otherwise."""
    if not argv or not INTERPRETERS.match(os.path.basename(argv[0])):
        return None
    for arg in argv[1:]:
        if arg.startswith("-"):
            continue
        full = os.path.normpath(os.path.join(cwd, arg))
        if root.is_file(full):
            return full
    return None


def version(exe: str, env: dict[str, str] | None, cwd: str, timeout: float = VERSION_TIMEOUT_S) -> str | None:
    """The first line `EXE --version` prints (stdout or stderr) where it exits with status 0 within `timeout`;
    None otherwise. Run under a keeper: nothing it starts outlives it."""
    from gpuvs import contain

    try:
        proc = contain.popen([exe, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=cwd, env=env)
    except OSError:
        return None
    data = bytearray()
    deadline = time.monotonic() + timeout
    ended = False
    try:
        fd = proc.stdout.fileno()
        while len(data) < VERSION_BYTES:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                break
            chunk = os.read(fd, VERSION_BYTES)
            if not chunk:
                ended = True
                break
            data += chunk
        code = proc.wait(timeout=max(0.0, deadline - time.monotonic())) if ended else None
    except (OSError, subprocess.TimeoutExpired):
        code = None
    finally:
        if proc.poll() is None:
            proc.stop(0.2)
        else:
            proc.close()
        proc.stdout.close()
    if code != 0:
        return None
    for line in data.decode("utf-8", "replace").splitlines():
        if line.strip():
            return safe_text(" ".join(line.split()))[:200]
    return None


def describe(argv: list[str], cwd: str, env: dict[str, str] | None, with_version: bool = True,
             root: Root = BESIDE) -> dict[str, Any]:
    """What the job with this argv, started in `cwd` with environment `env`, runs: the `program` configuration
    item (JSON data; store/records.ProgramRecord reads it). `with_version` False: `--version` is not run (a bare
    container's image runs nothing of gpuvs's)."""
    try:
        return _describe(argv, cwd, env, with_version, root)
    except Exception as exc:  # what it ran is told where it can be; never the trial's failure
        return {"argv0": argv[0] if argv else "", "workdir": cwd,
                "unresolved": f"could not be read: {type(exc).__name__}: {exc}"}


def _describe(argv: list[str], cwd: str, env: dict[str, str] | None, with_version: bool, root: Root
              ) -> dict[str, Any]:
    path = (env if env is not None else os.environ).get("PATH")
    out: dict[str, Any] = {"argv0": argv[0] if argv else "", "workdir": cwd}
    exe = resolve(argv[0], cwd, path, root) if argv else None
    if exe is None:
        out["unresolved"] = f"{argv[0] if argv else ''!r} is not an executable file there (PATH={path or ''})"
        return out
    out["executable"] = file_facts(exe, root)
    if with_version and says_version(exe):
        out["version"] = version(exe, env, cwd)
    script = script_of([argv[0], *argv[1:]], cwd, root)
    if script is not None:
        out["script"] = file_facts(script, root)
    return out
